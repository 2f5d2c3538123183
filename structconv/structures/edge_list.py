r"""A graph as users have it (an ``edge_index``, a sparse or dense adjacency) read into edge lists.

:class:`Edges` holds sources, targets and weights on one backend; :func:`as_edges` reads every
accepted graph form into it, checking it on the way.  Graph conventions are those of
:mod:`structconv.structures.graph`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backend import REGISTRY, Array, concatenate, device_of, find, is_integer_array, namespace, of, shape_str
from ..backend.checks import check_finite, check_index_range, check_readable, positive_int
from ..bases.sparse import MAX_ENTRIES, SparseBasis


@dataclass(frozen=True)
class Edges:
    """A graph as edge lists on one backend; build it with :func:`as_edges`, which checks it.

    Parameters
    ----------
    src, dst
        The source and target node of each edge, int64 ``(E,)``.
    weight
        The weight of each edge, floating ``(E,)``.
    num_nodes
        The number of (source) nodes.
    num_targets
        The number of target nodes of a bipartite graph; ``None`` (the default): the same
        ``num_nodes`` nodes.  A keyword.
    """

    src: Array
    dst: Array
    weight: Array
    num_nodes: int
    num_targets: int | None = field(default=None, kw_only=True)

    @property
    def targets(self) -> int:
        """The number of target nodes (``num_nodes`` unless the graph is bipartite)."""
        return self.num_nodes if self.num_targets is None else self.num_targets

    @property
    def backend(self) -> str:
        return of(self.weight).name

    def with_edges(self, src: Array, dst: Array, weight: Array) -> Edges:
        """The same nodes with other edges (what a normalisation returns).

        Parameters
        ----------
        src, dst, weight
            The new edges, as for :class:`Edges`.
        """
        return Edges(src, dst, weight, self.num_nodes, num_targets=self.num_targets)

    def reversed(self) -> Edges:
        """Every edge ``m -> n`` turned into ``n -> m`` (the source and target counts swap)."""
        back = None if self.num_targets is None else self.num_nodes
        return Edges(self.dst, self.src, self.weight, self.targets, num_targets=back)

    def to_basis(self) -> SparseBasis:
        """The adjacency as a one-member :class:`~structconv.SparseBasis`, shape ``(1, N, N)``."""
        return SparseBasis(self._index(), self.weight, (1, self.num_nodes, self.targets))

    def _index(self) -> Array:
        return namespace(self.weight).stack([self.src * 0, self.src, self.dst])


def checked_basis(edges: Edges) -> SparseBasis:
    """:meth:`Edges.to_basis` for edges read by :func:`as_edges` and only renormalised since, without a second check.

    Their nodes are in range and their weights finite (the normalisations keep both), so the
    basis a layer builds on every call skips :class:`~structconv.SparseBasis`' own checks.

    Parameters
    ----------
    edges
        Edges from :func:`as_edges`, possibly renormalised (never built by hand).
    """
    return SparseBasis._from_checked(edges._index(), edges.weight, (1, edges.num_nodes, edges.targets))


def members_basis(members: list[Edges]) -> SparseBasis:
    """One :class:`~structconv.SparseBasis` member per graph of ``members`` (all on the same nodes), unchecked.

    As :func:`checked_basis`, for edges read by :func:`as_edges` and only renormalised since:
    the members' entries are stacked as they are, without a sort.

    Parameters
    ----------
    members
        The members' edges, on the same source and target nodes.
    """
    first = members[0]
    xp = namespace(first.weight)
    index = concatenate([xp.stack([e.src * 0 + k, e.src, e.dst]) for k, e in enumerate(members)], 1)
    values = concatenate([e.weight for e in members], 0)
    return SparseBasis._from_checked(index, values, (len(members), first.num_nodes, first.targets))


def host_like(like: Array | None, *graph: Any) -> Array | None:
    """``like``, or for a ``like`` on the meta device an empty stand-in of its dtype where the graph is.

    Normalising a graph reads its values, which meta tensors do not hold; a meta ``like`` (a
    layer's meta ``x``) only places the result.  So the graph is read and normalised where it is
    (the device of the first torch array of ``graph``, else the CPU) and the caller moves the
    basis to the meta device (:meth:`~structconv.Basis.to`).  A graph on the meta device itself
    is left to :func:`as_edges`, which refuses it.

    Parameters
    ----------
    like
        The ``like`` a graph basis was asked for, or ``None``.
    *graph
        The graph's arrays (``edge_index``, weights); ``None`` and non-arrays are skipped.
    """
    if like is None or find(like) is None or device_of(like) != "meta":
        return like
    backend = of(like)
    device = next((device_of(a) for a in graph if find(a) is backend), "cpu")
    if device == "meta":
        return like
    stand_in: Array = namespace(like).zeros((0,), dtype=like.dtype, device=device)
    return stand_in


def is_matrix_graph(graph: Any) -> bool:
    """Whether ``graph`` is a matrix (torch sparse, ``scipy.sparse``, dense floating), not an ``edge_index``.

    Parameters
    ----------
    graph
        A graph as :func:`as_edges` takes it.
    """
    backend = find(graph)
    if backend is not None:
        return backend.is_sparse(graph) or not backend.is_integer(graph)
    return hasattr(graph, "tocoo") and hasattr(graph, "nnz")


def as_edges(
    graph: Any,
    num_nodes: int | None = None,
    edge_weight: Array | None = None,
    *,
    like: Array | None = None,
    adj_t: bool = False,
    num_targets: int | None = None,
) -> Edges:
    """Read a graph given as users have it.

    Parameters
    ----------
    graph
        An ``edge_index`` of shape ``(2, E)`` (integers; row 0 sources, row 1 targets), an
        :class:`Edges` already read (returned as it is, its arrays placed like ``like``), a torch
        sparse tensor or ``scipy.sparse`` matrix, or a dense floating adjacency.  A matrix is read
        as an adjacency (entry ``[m, n]`` weighs the edge ``m -> n``), or with ``adj_t=True`` as
        its transpose, PyTorch Geometric's ``adj_t`` (entry ``[n, m]`` weighs ``m -> n``: row =
        target, column = source), which is how PyG's layers read a sparse graph.
    num_nodes
        :math:`N` (the sources of a bipartite graph); required for an ``edge_index`` whose
        largest node is not the last one (isolated trailing nodes).  Defaults to the largest
        index plus one.
    edge_weight
        ``(E,)`` weights for an ``edge_index`` (default: ones).
    like
        Backend, dtype and device of the weights (default: those of ``edge_weight`` or of a
        weighted ``graph``; float32 on torch, float64 on NumPy).
    adj_t
        Read a matrix ``graph`` as PyG's ``adj_t`` (row = target) instead of an adjacency.
    num_targets
        The target nodes of a bipartite graph (default: the same ``num_nodes`` nodes); a matrix
        is then ``(num_nodes, num_targets)`` (``(num_targets, num_nodes)`` with ``adj_t``).

    Raises
    ------
    ValueError, TypeError
        For a malformed ``edge_index`` (shape, dtype, out-of-range or negative nodes), weights of
        the wrong length or non-finite weights, or a non-square adjacency.
    """
    if isinstance(graph, Edges):  # already read (a layer's graph_basis hook): placed like `like`
        if edge_weight is not None or num_nodes not in (None, graph.num_nodes):
            raise ValueError("graph is Edges already read: its weights and nodes are its own; pass no edge_weight")
        if num_targets is not None and num_targets != graph.targets:
            raise ValueError(f"graph is Edges already read, {graph.targets} targets; got num_targets={num_targets}")
        backend = find(like)
        if like is None or backend is None:  # nothing to place them like
            return graph
        arrays = (graph.src, graph.dst, graph.weight)
        placed = all(find(a) is backend and device_of(a) == device_of(like) for a in arrays)
        if placed and graph.weight.dtype == like.dtype:
            return graph
        src, dst = (backend.asarray(a, like, "int64") for a in (graph.src, graph.dst))
        return graph.with_edges(src, dst, backend.asarray(graph.weight, like))
    backend = find(graph)
    _check_real(graph, "graph")
    _check_real(edge_weight, "edge_weight")
    _check_real(like, "like")
    reading = "reading the graph (its node numbers and weights are checked)"
    if backend is not None:
        check_readable(graph, "graph" if is_matrix_graph(graph) else "edge_index", reading)
    if find(edge_weight) is not None:
        check_readable(edge_weight, "edge_weight", reading)
    if not is_matrix_graph(graph):
        if backend is None:
            raise TypeError(
                "graph must be an edge_index (2, E), a torch sparse tensor, a scipy.sparse matrix or a dense "
                f"adjacency, got {type(graph).__name__}"
            )
        graph = backend.plain(graph)  # PyG's EdgeIndex and other subclasses
        return _from_edge_index(graph, num_nodes, edge_weight, like, num_targets=num_targets)
    if edge_weight is not None:
        raise ValueError("edge_weight goes with an edge_index; a matrix graph carries its own weights")
    if num_targets is not None and num_nodes is None:
        raise ValueError("num_targets needs num_nodes (a bipartite matrix graph has two sizes)")
    if num_nodes is not None:  # a count, as for an edge_index (True and 1.0 would equal a 1 x 1 matrix's size)
        num_nodes = positive_int(num_nodes, "num_nodes")
    expect = None if num_nodes is None else (num_nodes, num_targets if num_targets is not None else num_nodes)
    if expect is not None and adj_t:
        expect = expect[::-1]
    src_row = 1 if adj_t else 0
    shape = tuple(int(s) for s in graph.shape)
    if backend is None:  # scipy.sparse
        _check_matrix(shape, expect, num_targets is not None)
        sp = graph.tocoo()
        idx: Any = np.stack([sp.row, sp.col]).astype(np.int64)
        floating = np.issubdtype(sp.data.dtype, np.floating)  # integer entries are weights too, in float64
        values: Any = sp.data if floating else np.asarray(sp.data, dtype=np.float64)
    else:
        if len(shape) != 2 and not backend.is_sparse(graph):
            raise ValueError(
                f"graph must be an edge_index of shape (2, E) or an (N, N) adjacency, got shape {shape_str(shape)}"
            )
        _check_matrix(shape, expect, num_targets is not None)
        idx, values, _ = backend.coordinates(graph)
        if not backend.is_floating(values):  # integer entries are weights too (as scipy's are)
            ref: Any = like
            dtype = ref.dtype if find(ref) is backend else backend.default_float()
            values = backend.asarray(values, values, dtype)
    if adj_t:
        idx = namespace(idx).stack([idx[1], idx[0]])
    sources, targets = shape[src_row], shape[1 - src_row]
    bipartite = num_targets is not None
    return _from_edge_index(idx, sources, values, like, "graph", num_targets=targets if bipartite else None)


def _check_real(a: Any, name: str) -> None:
    """Refuse complex numbers, whose imaginary part the cast to real weights would drop."""
    if a is None:
        return
    dtype = getattr(a, "dtype", None)  # arrays, torch sparse tensors, scipy.sparse matrices
    # Every library spells a complex dtype "complex..." (complex128, torch.complex64): one test for all.
    found = bool(np.iscomplexobj(a)) if dtype is None else "complex" in str(dtype)
    if found:
        got = "complex numbers" if dtype is None else f"dtype {dtype}"
        raise TypeError(f"{name} must hold real numbers, got {got} (the imaginary part would be lost)")


def _check_matrix(shape: tuple[int, ...], expect: tuple[int, int] | None, bipartite: bool) -> None:
    if bipartite and expect is not None:
        if shape != expect:
            raise ValueError(f"the adjacency matrix must have shape {expect}, got {shape_str(shape)}")
        return
    if len(shape) != 2 or shape[0] != shape[1]:
        raise ValueError(
            f"an adjacency matrix must be square (N, N), got shape {shape_str(shape)} "
            "(an edge_index (2, E) must hold integers)"
        )
    if expect is not None and expect[0] != shape[0]:
        raise ValueError(f"num_nodes={expect[0]} but the adjacency matrix has {shape[0]} rows")


#: An inferred node count is accepted up to this many nodes, or :data:`_NODES_PER_EDGE` per edge.
_INFERRED_NODES = 1 << 20
_NODES_PER_EDGE = 64


def _inferred_nodes(hi: int, edges: int) -> int:
    """The node count ``hi + 1`` read from an ``edge_index``'s largest node, if it is plausible.

    Every node gets a degree, a self-loop or a row, so one stray node number (``2**40``, say)
    would allocate terabytes.  A count far beyond what the edges can touch is refused with the
    memory it would need; ``num_nodes``, when given, is taken as meant.
    """
    nodes = hi + 1
    if nodes > max(_INFERRED_NODES, _NODES_PER_EDGE * edges):
        raise ValueError(
            f"edge_index refers to node {hi}, so the graph would have {nodes} nodes for only {edges} edges "
            f"({8 * nodes / 1e9:.3g} GB for each float64 array over the nodes); pass num_nodes if that many "
            "nodes are meant, or check edge_index for a stray node number"
        )
    return nodes


def _reference(*arrays: Any) -> Array:
    """The array whose backend, device (and dtype, for a weight) the edges take.

    Of arrays on several backends, the last registered one wins (NumPy, the first, converts to
    any other; the reverse would drop the device and autograd); among arrays of that backend,
    the first given.
    """
    present = [a for a in arrays if find(a) is not None]
    names = list(REGISTRY)
    ranks = [names.index(of(a).name) for a in present]
    return present[ranks.index(max(ranks))]  # the first of the latest backend (max(key=) breaks torch.compile's graph)


def _check_traced(index: Array, num_nodes: int, num_targets: int | None) -> None:
    """The node-number checks of :func:`_from_edge_index` as assertions in a compiled graph."""
    if num_targets is None:
        check_index_range(index.reshape(-1), num_nodes, f"edge_index's node numbers (num_nodes={num_nodes})")
        return
    check_index_range(index[0], num_nodes, "edge_index's source nodes")
    check_index_range(index[1], num_targets, "edge_index's target nodes")


def _from_edge_index(
    index: Array,
    num_nodes: int | None,
    weight: Array | None,
    like: Array | None,
    weight_name: str = "edge_weight",
    num_targets: int | None = None,
) -> Edges:
    if index.ndim != 2 or int(index.shape[0]) != 2:
        raise ValueError(f"edge_index must have shape (2, E), got {shape_str(tuple(index.shape))}")
    if not is_integer_array(index):
        raise TypeError(f"edge_index must hold integers, got dtype {index.dtype}")
    E = int(index.shape[1])
    traced = of(index).traced()
    if traced:  # compiled: the node numbers are checked inside the graph (_check_traced), never read back
        if num_nodes is None:
            raise ValueError(
                "num_nodes must be given for an edge_index under torch.compile (inferring it reads the node numbers)"
            )
    else:
        lo = int(index.min()) if E else 0
        hi = int(index.max()) if E else -1
        if lo < 0:
            raise ValueError(f"edge_index must hold node numbers >= 0, got {lo}")
        if num_nodes is None:
            if not E:
                raise ValueError("num_nodes must be given for a graph without edges")
            num_nodes = _inferred_nodes(hi, E)
    num_nodes = positive_int(num_nodes, "num_nodes")
    if num_targets is not None and (
        isinstance(num_targets, bool) or not isinstance(num_targets, int | np.integer) or num_targets < 0
    ):
        raise ValueError(f"num_targets must be a non-negative integer, got {num_targets!r}")
    targets = int(num_nodes if num_targets is None else num_targets)
    if int(num_nodes) * targets > MAX_ENTRIES:  # before any array over the nodes is allocated
        raise ValueError(
            f"num_nodes={num_nodes} is too large: an adjacency of {num_nodes} x {targets} nodes has more entries "
            f"than int64 can number ({MAX_ENTRIES})"
        )
    if traced:
        _check_traced(index, num_nodes, num_targets)
    elif num_targets is None:
        if hi >= num_nodes:
            raise ValueError(f"edge_index refers to node {hi} but num_nodes={num_nodes} (nodes are 0..{num_nodes - 1})")
    else:
        for row, size, what in ((0, num_nodes, "source"), (1, num_targets, "target")):
            top = int(index[row].max()) if E else -1
            if top >= size:
                raise ValueError(f"edge_index refers to {what} node {top} but there are {size} {what} nodes")
    ref = _reference(like, weight, index)
    backend = of(ref)
    floating = ref is not index and backend.is_floating(ref)
    dtype = ref.dtype if floating else backend.default_float()
    index = backend.asarray(index, ref, "int64")
    if weight is None:  # unit weights, finite by construction: nothing to check (a layer reads one per call)
        weight = namespace(ref).ones(E, dtype=dtype, device=device_of(ref))
    else:
        weight = backend.asarray(weight, ref, dtype)
        if tuple(weight.shape) != (E,):
            raise ValueError(f"edge_weight must have shape (E,) = ({E},), got {shape_str(tuple(weight.shape))}")
        check_finite(weight, "edge weights" if weight_name == "graph" else "edge_weight")
    targets_given = None if num_targets is None else int(num_targets)
    return Edges(index[0], index[1], weight, int(num_nodes), num_targets=targets_given)
