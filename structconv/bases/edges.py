r"""Bases whose members share one sparsity pattern: weights on the edges of one graph.

Attention restricted to a graph (GAT's heads, masked attention) gives :math:`K` members that
differ only in their weights: :math:`A_{k,mn} = w_{ek}` for each edge :math:`e = (m \to n)`.
Storing the pattern once and the weights as an ``(E, K)`` array lets every hook gather each
edge's source row once for all members, i.e. rows of width :math:`K\cdot C` instead of
:math:`K` separate rows of width :math:`C` (the sparse representation's layout), which is what
makes scatter kernels efficient.  GAT's heads, a softmax of per-edge logits over each target's
edges, are a :class:`~structconv.bases.softmax_edges.SoftmaxEdgeBasis`, whose hooks are this
basis' on the normalised weights and whose costs add the softmax to :func:`cost_each_on_edges`
and :func:`cost_members_on_edges`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..backend import Array, as_index, concatenate, device_of, find, is_integer_array, namespace, of, shape_str
from ..backend.checks import check_array, check_index_range
from .base import Cost, _member_list, _PlacedByArray
from .sparse import Derived, SparseBasis


class OnEdgeList(_PlacedByArray):
    """What a basis carried by one edge list has, whatever its per-edge values mean.

    ``src`` and ``dst`` ``(E,)`` name each edge's input and output entry, ``(M, N)`` the entries,
    and one ``(E, K)`` array (:meth:`_per_edge`: weights, logits) sets the members, the dtype and
    the device.
    """

    __slots__ = ("_dst", "_shape", "_src")
    _src: Array
    _dst: Array
    _shape: tuple[int, int]

    def _per_edge(self) -> Array:
        """The ``(E, K)`` array the members are made of."""
        raise NotImplementedError

    @property
    def src(self) -> Array:
        """The edges' input entries, ``(E,)``."""
        return self._src

    @property
    def dst(self) -> Array:
        """The edges' output entries, ``(E,)``."""
        return self._dst

    @property
    def shape(self) -> tuple[int, ...]:
        return (int(self._per_edge().shape[1]), *self._shape)

    def _placed(self) -> Array:
        return self._per_edge()

    def plan_key(self) -> tuple[Any, ...]:
        return (type(self).__name__, self.shape, int(self._per_edge().shape[0]))


class EdgeBasis(OnEdgeList):
    r"""``K`` members on one edge pattern: :math:`A_{k,mn} = \sum_{e:(m\to n)} w_{ek}`.

    Parameters
    ----------
    src, dst
        ``(E,)`` integer arrays: edge :math:`e` goes from input entry ``src[e]`` to output entry
        ``dst[e]`` (repeated edges add up).
    weights
        ``(E, K)`` floating array on the same backend (it may require grad).
    shape
        ``(M, N)``.

    Examples
    --------
    >>> import numpy as np
    >>> from structconv import EdgeBasis
    >>> weights = np.array([[1.0, 2.0], [3.0, 4.0]])
    >>> A = EdgeBasis(np.array([0, 1]), np.array([1, 1]), weights, (2, 2))
    >>> A.to_dense()[1]
    array([[0., 2.],
           [0., 4.]])
    """

    __slots__ = ("_derived", "_weights")
    representation = "edges"
    host_orders = frozenset({"atheta"})

    def __init__(self, src: Array, dst: Array, weights: Array, shape: Sequence[int]) -> None:
        for name, given in (("src", src), ("dst", dst), ("weights", weights)):
            if find(given) is None:
                expected = "(E, K)" if name == "weights" else "(E,)"
                raise TypeError(
                    f"{name} must be a numpy.ndarray or a torch.Tensor of shape {expected}, got {type(given).__name__}"
                )
        if (
            isinstance(shape, str | bytes)
            or not isinstance(shape, Sequence)
            or len(shape) != 2
            or not all(isinstance(s, int | np.integer) and not isinstance(s, bool) and s >= 0 for s in shape)
        ):
            raise ValueError(f"shape must be (M, N), two non-negative integers, got {shape!r:.80}")
        if int(weights.shape[0]):
            check_array(weights, "weights", (2,), ("(E, K)",))
        elif weights.ndim != 2 or int(weights.shape[1]) == 0:
            raise ValueError(f"weights must have shape (E, K), got {shape_str(tuple(weights.shape))}")
        M, N = (int(s) for s in shape)
        E = int(weights.shape[0])
        for name, idx, size in (("src", src, M), ("dst", dst, N)):
            if tuple(idx.shape) != (E,):
                raise ValueError(f"{name} must have shape (E,) = ({E},), got {shape_str(tuple(idx.shape))}")
            check_index_range(idx, size, name)
        if of(src, "src") is not of(weights, "weights") or of(dst, "dst") is not of(weights, "weights"):
            raise TypeError("src, dst and weights must be on the same backend")
        for name, idx in (("src", src), ("dst", dst)):
            if not is_integer_array(idx):
                raise TypeError(f"{name} must hold integers, got dtype {idx.dtype}")
            if device_of(idx) != device_of(weights):
                raise ValueError(f"{name} is on {device_of(idx)} but weights are on {device_of(weights)}")
        self._src, self._dst, self._weights, self._shape = src, dst, weights, (M, N)
        self._derived = Derived()

    def _per_edge(self) -> Array:
        return self._weights

    def _products(self) -> SparseBasis | None:
        """The members as a :class:`~structconv.SparseBasis`, whose products run where gather-scatter would.

        With constant weights, a sparse matrix built once (a sort) multiplies several times
        faster than a gather and a scatter per product on the CPU (``docs/internals.rst``, the
        torch backend); weights that require grad, a traced or a meta call keep the
        gather-scatter, whose gradient reaches the weights and which needs no host sort.
        """
        w = self._weights
        backend = of(w)
        if backend.requires_grad(w) or backend.traced() or device_of(w) == "meta" or not int(w.shape[0]):
            return None
        # Keyed by the weights' version: an in-place change (under no_grad) builds it anew, as the
        # gather-scatter read the current weights.
        version = getattr(w, "_version", 0)
        kept = self._derived.get("sparse", lambda: None, keep=False)
        if kept is None or kept[0] != version:
            kept = (version, self._sparse_checked())
            self._derived.put("sparse", kept)
        sparse: SparseBasis = kept[1]
        return sparse

    def _sparse_checked(self) -> SparseBasis:
        """:meth:`to_sparse` without a second check of the entries this basis' constructor checked."""
        index, values = self._sparse_entries()
        return SparseBasis._from_checked(index, values, self.shape)

    def _sparse_entries(self) -> tuple[Array, Array]:
        """The ``(3, K E)`` member, source and target of each entry, and its ``(K E,)`` values, member-major."""
        K, w = self.K, self._weights
        k = as_index(np.repeat(np.arange(K), w.shape[0]), self._src)
        index = namespace(w).stack([k, concatenate([self._src] * K, 0), concatenate([self._dst] * K, 0)])
        return index, w.T.reshape(-1)

    def plan_key(self) -> tuple[Any, ...]:
        return (*super().plan_key(), self._products() is not None)

    @property
    def weights(self) -> Array:
        """:math:`w`, ``(E, K)``."""
        return self._weights

    # --- value operations ------------------------------------------------------------------
    def to_sparse(self) -> SparseBasis:
        """The same basis as a :class:`~structconv.SparseBasis` (``K·E`` entries)."""
        return SparseBasis(*self._sparse_entries(), self.shape)

    def to_dense(self) -> Array:
        return self.to_sparse().to_dense()

    def transpose(self) -> EdgeBasis:
        return EdgeBasis(self._dst, self._src, self._weights, (self._shape[1], self._shape[0]))

    def select(self, members: Sequence[int]) -> EdgeBasis:
        index = _member_list(members)
        return EdgeBasis(self._src, self._dst, self._weights[:, index], self._shape)

    def to(self, device: Any = None, dtype: Any = None) -> EdgeBasis:
        backend = of(self._weights)
        weights = backend.move(self._weights, device, dtype, what="basis")
        return EdgeBasis(backend.move(self._src, device), backend.move(self._dst, device), weights, self._shape)

    def energy(self) -> float:
        return self.to_sparse().energy()

    # --- engine hooks ----------------------------------------------------------------------
    def apply_each(self, x: Array) -> Array:
        sparse = self._products()
        if sparse is not None:
            return sparse.apply_each(x)
        backend = of(x)
        gathered = backend.take(x, self._src, 1)  # (B, E, C)
        weighted = gathered[:, :, None, :] * self._weights[None, :, :, None]  # (B, E, K, C)
        return backend.index_add(weighted, self._dst, self.N, 1).swapaxes(1, 2)

    def apply_members(self, s: Array, *, reduce: bool) -> Array:
        sparse = self._products()
        if sparse is not None:
            return sparse.apply_members(s, reduce=reduce)
        backend = of(s)
        rows = s.swapaxes(1, 2)  # (B, M, K, C): one row per entry holds every member
        weighted = backend.take(rows, self._src, 1) * self._weights[None, :, :, None]  # (B, E, K, C)
        if reduce:
            return backend.index_add(weighted.sum(2), self._dst, self.N, 1)
        return backend.index_add(weighted, self._dst, self.N, 1).swapaxes(1, 2)

    def cost_build(self) -> Cost:
        sparse = self._products()
        return Cost() if sparse is None else sparse.cost_build()

    def cost_each(self, batch: int, channels: int) -> Cost:
        sparse = self._products()
        if sparse is not None:
            return sparse.cost_each(batch, channels)
        return cost_each_on_edges(int(self._weights.shape[0]), self.K, self.N, batch, channels)

    def cost_members(self, batch: int, channels: int, *, reduce: bool) -> Cost:
        sparse = self._products()
        if sparse is not None:
            return sparse.cost_members(batch, channels, reduce=reduce)
        return cost_members_on_edges(int(self._weights.shape[0]), self.K, self.N, batch, channels, reduce=reduce)


def cost_each_on_edges(edges: int, members: int, outputs: int, batch: int, channels: int) -> Cost:
    r"""The cost of :meth:`EdgeBasis.apply_each`: each edge's source row gathered, weighed by every member, added.

    Parameters
    ----------
    edges, members, outputs
        :math:`E`, :math:`K` and :math:`N` of the basis.
    batch, channels
        :math:`B` and :math:`C` of ``x``.
    """
    B, E, K, N, C = batch, edges, members, outputs, channels
    return Cost(0.0, float(B * E * C + B * E * K * C + B * N * K * C), 2.0 * B * E * K * C)


def cost_members_on_edges(edges: int, members: int, outputs: int, batch: int, channels: int, *, reduce: bool) -> Cost:
    r"""The cost of :meth:`EdgeBasis.apply_members`: rows of every member gathered, weighed, (summed,) added.

    Parameters
    ----------
    edges, members, outputs
        :math:`E`, :math:`K` and :math:`N` of the basis.
    batch, channels
        :math:`B` and :math:`C` of ``s``.
    reduce
        As for :meth:`EdgeBasis.apply_members`.
    """
    B, E, K, N, C = batch, edges, members, outputs, channels
    summed = B * E * C if reduce else 0
    out = B * N * C * (1 if reduce else K)
    return Cost(0.0, float(2 * B * E * K * C + summed + out), 2.0 * B * E * K * C)
