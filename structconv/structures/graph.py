r"""Graph bases (Andreoli §2.2): normalised adjacency, its powers, Chebyshev polynomials, relations.

A graph on :math:`N` nodes enters the formula as sparse :math:`N\times N` matrices with
:math:`A_{mn} \ne 0` for an edge from node :math:`m` (source) to node :math:`n` (target), so that
:math:`(A^\top x)_n = \sum_{m \to n} A_{mn} x_m` gathers messages at each target, as PyTorch
Geometric's ``edge_index`` (row 0 sources, row 1 targets) does.

Conventions, chosen deliberately:

* **multi-edges** add up (their weights are summed, as repeated messages are);
* **self-loops** are kept as given, except where a normalisation adds them (``gcn`` adds a
  loop only to nodes that lack one and keeps existing loop weights, like PyG's ``gcn_norm``);
* **isolated nodes** (degree 0) get zero rows and columns, never ``inf`` or ``NaN``;
* **directed graphs** are used as given; degrees are counted at the target (in-degree) for
  ``gcn`` and ``powers``, and both walk directions are offered by ``diffusion``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import Array, is_integer_array, is_torch, namespace, shape_str, to_numpy
from ..backend.checks import check_finite
from ..bases.base import Basis, Cost
from ..bases.sparse import SparseBasis

KINDS = ("adjacency", "gcn", "powers", "chebyshev", "diffusion", "relational")


# --- graph input ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Edges:
    """A graph as edge lists on one backend: ``src``, ``dst`` (int64, ``(E,)``), ``weight`` (``(E,)``).

    ``num_nodes`` counts the sources; ``num_targets`` the targets of a bipartite graph (``None``:
    the same nodes).
    """

    src: Array
    dst: Array
    weight: Array
    num_nodes: int
    num_targets: int | None = None

    @property
    def targets(self) -> int:
        """The number of target nodes (``num_nodes`` unless the graph is bipartite)."""
        return self.num_nodes if self.num_targets is None else self.num_targets

    @property
    def backend(self) -> str:
        return "torch" if is_torch(self.weight) else "numpy"

    def with_edges(self, src: Array, dst: Array, weight: Array) -> Edges:
        return Edges(src, dst, weight, self.num_nodes, self.num_targets)

    def reversed(self) -> Edges:
        """Every edge ``m -> n`` turned into ``n -> m`` (the source and target counts swap)."""
        back = None if self.num_targets is None else self.num_nodes
        return Edges(self.dst, self.src, self.weight, self.targets, back)

    def to_basis(self) -> SparseBasis:
        """The adjacency as a one-member :class:`~structconv.SparseBasis`, shape ``(1, N, N)``."""
        zeros = self.src * 0
        stack = namespace(self.weight).stack
        return SparseBasis(stack([zeros, self.src, self.dst]), self.weight, (1, self.num_nodes, self.targets))


def _cat(arrays: list[Array], axis: int = 0) -> Array:
    return namespace(arrays[0]).cat(arrays, axis) if is_torch(arrays[0]) else np.concatenate(arrays, axis)


def is_matrix_graph(graph: Any) -> bool:
    """Whether ``graph`` is a matrix (torch sparse, ``scipy.sparse``, dense floating), not an ``edge_index``."""
    if is_torch(graph) and graph.layout != _strided():
        return True
    if hasattr(graph, "tocoo") and hasattr(graph, "nnz"):
        return True
    return (is_torch(graph) or isinstance(graph, np.ndarray)) and not is_integer_array(graph)


def as_edges(
    graph: Any,
    num_nodes: int | None = None,
    edge_weight: Array | None = None,
    like: Array | None = None,
    *,
    adj_t: bool = False,
    num_targets: int | None = None,
) -> Edges:
    """Read a graph given as users have it.

    Parameters
    ----------
    graph
        An ``edge_index`` of shape ``(2, E)`` (integers; row 0 sources, row 1 targets), a torch
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
    if not is_matrix_graph(graph):
        if not (is_torch(graph) or isinstance(graph, np.ndarray)):
            raise TypeError(
                "graph must be an edge_index (2, E), a torch sparse tensor, a scipy.sparse matrix or a dense "
                f"adjacency, got {type(graph).__name__}"
            )
        if is_torch(graph) and type(graph).__name__ != "Tensor":  # PyG's EdgeIndex and other subclasses
            import torch

            graph = graph.as_subclass(torch.Tensor)
        return _from_edge_index(graph, num_nodes, edge_weight, like, num_targets=num_targets)
    if edge_weight is not None:
        raise ValueError("edge_weight goes with an edge_index; a matrix graph carries its own weights")
    if num_targets is not None and num_nodes is None:
        raise ValueError("num_targets needs num_nodes (a bipartite matrix graph has two sizes)")
    expect = None if num_nodes is None else (num_nodes, num_targets if num_targets is not None else num_nodes)
    if expect is not None and adj_t:
        expect = expect[::-1]
    src_row = 1 if adj_t else 0
    if is_torch(graph) and graph.layout != _strided():
        coo = graph.to_sparse_coo().coalesce()
        _check_matrix(tuple(coo.shape), expect, num_targets is not None)
        values = coo.values()
        if not values.is_floating_point():  # integer entries are weights too (as scipy's are)
            ref: Any = like
            values = values.to(ref.dtype if is_torch(ref) else _default_dtype())
        idx = coo.indices()
        shape = tuple(int(s) for s in coo.shape)
    elif hasattr(graph, "tocoo"):  # scipy.sparse
        sp = graph.tocoo()
        shape = tuple(int(s) for s in sp.shape)
        _check_matrix(shape, expect, num_targets is not None)
        idx = np.stack([sp.row, sp.col]).astype(np.int64)
        values = np.asarray(sp.data, dtype=np.float64)
    else:
        if graph.ndim != 2:
            raise ValueError(
                f"graph must be an edge_index of shape (2, E) or an (N, N) adjacency, got shape "
                f"{shape_str(tuple(graph.shape))}"
            )
        shape = tuple(int(s) for s in graph.shape)
        _check_matrix(shape, expect, num_targets is not None)
        idx = graph.nonzero().T if is_torch(graph) else np.stack(np.nonzero(graph))
        values = graph[tuple(idx)]
    if adj_t:
        idx = idx.flip(0) if is_torch(idx) else idx[::-1].copy()
    sources, targets = shape[src_row], shape[1 - src_row]
    bipartite = num_targets is not None
    return _from_edge_index(idx, sources, values, like, "graph", num_targets=targets if bipartite else None)


def _check_matrix(shape: tuple[int, ...], expect: tuple[int, int] | None, bipartite: bool) -> None:
    if bipartite and expect is not None:
        if shape != expect:
            raise ValueError(f"the adjacency matrix must have shape {expect}, got {shape_str(shape)}")
        return
    _square(shape, None if expect is None else expect[0])


def _strided() -> Any:
    import torch

    return torch.strided


def _square(shape: tuple[int, ...], num_nodes: int | None) -> None:
    if len(shape) != 2 or shape[0] != shape[1]:
        raise ValueError(
            f"an adjacency matrix must be square (N, N), got shape {shape_str(shape)} "
            "(an edge_index (2, E) must hold integers)"
        )
    if num_nodes is not None and num_nodes != shape[0]:
        raise ValueError(f"num_nodes={num_nodes} but the adjacency matrix has {shape[0]} rows")


def _default_dtype() -> Any:
    import torch

    return torch.get_default_dtype()


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
    lo = int(index.min()) if E else 0
    hi = int(index.max()) if E else -1
    if lo < 0:
        raise ValueError(f"edge_index must hold node numbers >= 0, got {lo}")
    if num_nodes is None:
        if not E:
            raise ValueError("num_nodes must be given for a graph without edges")
        num_nodes = hi + 1
    if isinstance(num_nodes, bool) or not isinstance(num_nodes, int | np.integer) or num_nodes <= 0:
        raise ValueError(f"num_nodes must be a positive integer, got {num_nodes!r}")
    if num_targets is None:
        if hi >= num_nodes:
            raise ValueError(f"edge_index refers to node {hi} but num_nodes={num_nodes} (nodes are 0..{num_nodes - 1})")
    else:
        for row, size, what in ((0, num_nodes, "source"), (1, num_targets, "target")):
            top = int(index[row].max()) if E else -1
            if top >= size:
                raise ValueError(f"edge_index refers to {what} node {top} but there are {size} {what} nodes")
    torch_side = is_torch(index) or is_torch(weight) or is_torch(like)
    if torch_side:
        import torch

        ref: Any = like if is_torch(like) else weight if is_torch(weight) else index
        device = ref.device
        dtype = ref.dtype if ref is not index else torch.get_default_dtype()
        index = torch.as_tensor(index, device=device).long()
        if weight is None:
            weight = torch.ones(E, dtype=dtype, device=device)
        else:
            weight = torch.as_tensor(weight, device=device).to(dtype)
    else:
        index = np.asarray(index, dtype=np.int64)
        dtype = like.dtype if isinstance(like, np.ndarray) else np.float64
        weight = np.ones(E, dtype=dtype) if weight is None else np.asarray(weight).astype(dtype, copy=False)
    if tuple(weight.shape) != (E,):
        raise ValueError(f"edge_weight must have shape (E,) = ({E},), got {shape_str(tuple(weight.shape))}")
    check_finite(weight, "edge weights" if weight_name == "graph" else "edge_weight")
    return Edges(index[0], index[1], weight, int(num_nodes), None if num_targets is None else int(num_targets))


# --- normalisations ----------------------------------------------------------------------------------
def _scatter_sum(values: Array, index: Array, size: int) -> Array:
    if is_torch(values):
        return values.new_zeros(size).index_add(0, index, values)
    out = np.zeros(size, dtype=values.dtype)
    np.add.at(out, index, values)
    return out


def _take(a: Array, index: Array) -> Array:
    """``a[index]``; on torch through ``index_select``, whose backward is a scatter-add."""
    return a.index_select(0, index) if is_torch(a) else a[index]


def _check_non_negative(edges: Edges, what: str) -> None:
    if bool((edges.weight < 0).any()):
        raise ValueError(
            f"edge weights (edge_weight, or the entries of a matrix graph) must be non-negative for {what} "
            "(degrees are square-rooted or inverted)"
        )


def _inverse(deg: Array, power: float) -> Array:
    """``deg ** -power`` with 0 where the degree is 0 (isolated nodes contribute nothing)."""
    if is_torch(deg):
        out = deg.pow(-power)
        return out.masked_fill(deg == 0, 0.0)
    with np.errstate(divide="ignore"):
        out = np.where(deg > 0, np.power(np.where(deg > 0, deg, 1.0), -power), 0.0)
    return out.astype(deg.dtype, copy=False)


def add_remaining_self_loops(edges: Edges, fill: float = 1.0) -> Edges:
    """Give every node exactly one self-loop: keep an existing loop's weight, else use ``fill``."""
    N = edges.num_nodes
    loop = edges.src == edges.dst
    keep = ~loop
    loop_weight: Any
    nodes: Any
    if is_torch(edges.weight):
        import torch

        loop_weight = torch.full((N,), fill, dtype=edges.weight.dtype, device=edges.weight.device)
        nodes = torch.arange(N, device=edges.src.device)
    else:
        loop_weight = np.full(N, fill, dtype=edges.weight.dtype)
        nodes = np.arange(N)
    loop_weight[edges.src[loop]] = edges.weight[loop]
    return edges.with_edges(
        _cat([edges.src[keep], nodes]), _cat([edges.dst[keep], nodes]), _cat([edges.weight[keep], loop_weight])
    )


def add_self_loops(edges: Edges, fill: float = 1.0) -> Edges:
    r""":math:`A + \mathrm{fill}\cdot I`: a loop of weight ``fill`` on every node, added to any loop it already has.

    This is what PyG does to a sparse adjacency (``adj_t``); an ``edge_index`` instead gets
    :func:`add_remaining_self_loops`.
    """
    N = edges.num_nodes
    nodes: Any
    if is_torch(edges.weight):
        import torch

        nodes = torch.arange(N, device=edges.src.device)
        loop_weight: Any = torch.full((N,), fill, dtype=edges.weight.dtype, device=edges.weight.device)
    else:
        nodes = np.arange(N)
        loop_weight = np.full(N, fill, dtype=edges.weight.dtype)
    return edges.with_edges(_cat([edges.src, nodes]), _cat([edges.dst, nodes]), _cat([edges.weight, loop_weight]))


def remove_self_loops(edges: Edges) -> Edges:
    keep = edges.src != edges.dst
    return edges.with_edges(edges.src[keep], edges.dst[keep], edges.weight[keep])


def gcn_normalize(edges: Edges, add_self_loops: bool = True, improved: bool = False) -> Edges:
    r""":math:`\tilde D^{-1/2}\tilde A\tilde D^{-1/2}` with :math:`\tilde A = A + I` (loops added where missing).

    ``improved`` uses weight 2 for the added loops; degrees are in-degrees (at the target).
    """
    _check_non_negative(edges, "gcn normalisation")
    if add_self_loops:
        edges = add_remaining_self_loops(edges, 2.0 if improved else 1.0)
    dinv = _inverse(_scatter_sum(edges.weight, edges.dst, edges.num_nodes), 0.5)
    return edges.with_edges(edges.src, edges.dst, _take(dinv, edges.src) * edges.weight * _take(dinv, edges.dst))


def walk_normalize(edges: Edges, direction: str = "forward") -> Edges:
    r"""Random-walk averaging, as diffusion convolution (DCRNN) uses it.

    ``forward`` gives :math:`y = D_{\mathrm{out}}^{-1}A\,x`: each node averages its out-neighbours
    (the member holds the reversed edges, since the formula gathers at targets); ``backward``
    gives :math:`y = D_{\mathrm{in}}^{-1}A^\top x`: each node averages its in-neighbours.
    """
    _check_non_negative(edges, "random-walk normalisation")
    if direction == "forward":
        inv = _inverse(_scatter_sum(edges.weight, edges.src, edges.num_nodes), 1.0)
        return edges.with_edges(edges.dst, edges.src, _take(inv, edges.src) * edges.weight)
    if direction == "backward":
        inv = _inverse(_scatter_sum(edges.weight, edges.dst, edges.num_nodes), 1.0)
        return edges.with_edges(edges.src, edges.dst, _take(inv, edges.dst) * edges.weight)
    raise ValueError(f"direction must be 'forward' or 'backward', got {direction!r}")


def laplacian(edges: Edges, normalization: str | None = "sym") -> Edges:
    r"""The graph Laplacian as edges: one loop per node plus the negated, normalised edges.

    :math:`L = I - D^{-1/2}AD^{-1/2}` (``"sym"``), :math:`I - D^{-1}A` (``"rw"``) or
    :math:`D - A` (``None``).  Self-loops of the input are dropped first; degrees are
    out-degrees (at the source), as PyG's ``get_laplacian`` counts them.
    """
    if normalization not in ("sym", "rw", None):
        raise ValueError(f"normalization must be 'sym', 'rw' or None, got {normalization!r}")
    if normalization is not None:
        _check_non_negative(edges, "a normalised Laplacian")
    edges = remove_self_loops(edges)
    deg = _scatter_sum(edges.weight, edges.src, edges.num_nodes)
    if normalization == "sym":
        dinv = _inverse(deg, 0.5)
        off = -_take(dinv, edges.src) * edges.weight * _take(dinv, edges.dst)
        diag = namespace(edges.weight).ones_like(deg)
    elif normalization == "rw":
        off = -_take(_inverse(deg, 1.0), edges.src) * edges.weight
        diag = namespace(edges.weight).ones_like(deg)
    else:
        off, diag = -edges.weight, deg
    lib = namespace(edges.weight)
    nodes = lib.arange(edges.num_nodes, device=edges.src.device) if is_torch(edges.src) else np.arange(edges.num_nodes)
    return edges.with_edges(_cat([edges.src, nodes]), _cat([edges.dst, nodes]), _cat([off, diag]))


def scaled_laplacian(
    edges: Edges, normalization: str = "sym", lambda_max: float | str | None = None
) -> tuple[Edges, float]:
    r"""The scaled Laplacian :math:`\hat L = 2L/\lambda_{\max} - I`.

    :math:`L = I - D^{-1/2}AD^{-1/2}` (``sym``) or :math:`I - D^{-1}A` (``rw``), from
    :func:`laplacian` (self-loops dropped, out-degrees).  ``lambda_max`` defaults to 2 (the
    bound for ``sym``); ``"auto"`` computes the largest eigenvalue of :math:`L`.  Returns
    :math:`\hat L` and :math:`\lambda_{\max}`.
    """
    if normalization not in ("sym", "rw"):
        raise ValueError(f"normalization must be 'sym' or 'rw', got {normalization!r}")
    lap = laplacian(edges, normalization)
    if lambda_max is None:
        lam = 2.0
    elif lambda_max == "auto":
        lam = _largest_eigenvalue(lap)
    elif isinstance(lambda_max, int | float) and not isinstance(lambda_max, bool) and lambda_max > 0:
        lam = float(lambda_max)
    else:
        raise ValueError(f"lambda_max must be a positive number, 'auto' or None, got {lambda_max!r}")
    scaled = lap.weight * (2.0 / lam)
    is_loop = lap.src == lap.dst
    scaled = scaled - is_loop.to(scaled.dtype) if is_torch(scaled) else scaled - is_loop.astype(scaled.dtype)
    return lap.with_edges(lap.src, lap.dst, scaled), lam


def _largest_eigenvalue(edges: Edges) -> float:
    import scipy.sparse
    import scipy.sparse.linalg

    N = edges.num_nodes
    matrix = scipy.sparse.coo_array(
        (to_numpy(edges.weight).astype(np.float64), (to_numpy(edges.src), to_numpy(edges.dst))), shape=(N, N)
    ).tocsr()
    if N < 3:
        return float(np.linalg.eigvals(matrix.toarray()).real.max())
    value = scipy.sparse.linalg.eigs(matrix, k=1, which="LR", return_eigenvectors=False)
    return float(value.real.max())


# --- polynomial bases ---------------------------------------------------------------------------------
class PolynomialBasis(Basis):
    r"""Members :math:`p_{d}(S)` for chosen degrees :math:`d` of a square sparse matrix :math:`S`.

    ``family="powers"`` has :math:`p_d(S) = S^d`; ``family="chebyshev"`` has the Chebyshev
    polynomials :math:`T_0 = I`, :math:`T_1 = S`, :math:`T_d = 2S\,T_{d-1} - T_{d-2}`.

    The members are never formed: :meth:`apply_each` runs the three-term recurrence on
    :math:`x` (:math:`D` sparse products for degree :math:`D`), and the reduced
    :meth:`apply_members` runs it backwards (Horner's rule for powers, Clenshaw's for
    Chebyshev), again :math:`D` sparse products.  The engine's ``"materialized"`` order forms
    the sparse matrices :math:`p_d(S)` instead, which pays when they stay sparse and many
    channels or instances share them.

    Parameters
    ----------
    matrix
        :math:`S` as a one-member :class:`~structconv.SparseBasis` of shape ``(1, N, N)``.
    degrees
        The degrees of the members, in order (e.g. ``range(K + 1)`` for TAGConv, ``[K]`` for SGConv).
    family
        ``"powers"`` or ``"chebyshev"``.
    """

    __slots__ = ("_degrees", "_family", "_materialized", "_matrix")
    representation = "polynomial"

    def __init__(self, matrix: SparseBasis, degrees: Sequence[int], family: str = "powers") -> None:
        if not isinstance(matrix, SparseBasis) or matrix.shape[0] != 1 or matrix.M != matrix.N:
            raise ValueError("matrix must be a one-member square SparseBasis of shape (1, N, N)")
        if family not in ("powers", "chebyshev"):
            raise ValueError(f"family must be 'powers' or 'chebyshev', got {family!r}")
        degs = tuple(int(d) for d in degrees)
        if not degs or min(degs) < 0:
            raise ValueError(f"degrees must be non-empty and non-negative, got {degrees!r}")
        self._matrix, self._degrees, self._family = matrix, degs, family
        self._materialized: SparseBasis | None = None

    @property
    def matrix(self) -> SparseBasis:
        return self._matrix

    @property
    def degrees(self) -> tuple[int, ...]:
        return self._degrees

    @property
    def family(self) -> str:
        return self._family

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self._degrees), self._matrix.M, self._matrix.N)

    @property
    def backend(self) -> str:
        return self._matrix.backend

    @property
    def dtype(self) -> Any:
        return self._matrix.dtype

    @property
    def device(self) -> str:
        return self._matrix.device

    def plan_key(self) -> tuple[Any, ...]:
        return (type(self).__name__, self.shape, self._matrix.stored, self._degrees, self._family)

    # --- the recurrence ----------------------------------------------------------------------
    def _step(self, v: Array) -> Array:
        r""":math:`S^\top v` for ``v`` of shape ``(B, N, C)``."""
        return self._matrix.apply_each(v)[:, 0]

    def _forward(self, v: Array, upto: int) -> list[Array]:
        """:math:`p_d(S)^\\top v` for d = 0..upto."""
        out = [v]
        if upto >= 1:
            out.append(self._step(v))
        for _ in range(2, upto + 1):
            nxt = self._step(out[-1])
            out.append(2 * nxt - out[-2] if self._family == "chebyshev" else nxt)
        return out

    def _backward_sum(self, terms: dict[int, Array], like: Array) -> Array:
        r""":math:`\sum_d p_d(S)^\top t_d` by Horner (powers) or Clenshaw (Chebyshev)."""
        top = max(terms)
        zero = like * 0
        if self._family == "powers":
            acc = terms.get(top, zero)
            for d in range(top - 1, -1, -1):
                acc = self._step(acc) + terms.get(d, zero)
            return acc
        b1, b2 = zero, zero  # b_{d+1}, b_{d+2}
        for d in range(top, 0, -1):
            b1, b2 = terms.get(d, zero) + 2 * self._step(b1) - b2, b1
        return terms.get(0, zero) + self._step(b1) - b2

    def apply_each(self, x: Array) -> Array:
        powers = self._forward(x, max(self._degrees))
        stack = namespace(x).stack
        return stack([powers[d] for d in self._degrees], 1)

    def apply_members(self, s: Array, reduce: bool) -> Array:
        if reduce:
            terms: dict[int, Array] = {}
            for k, d in enumerate(self._degrees):
                terms[d] = terms[d] + s[:, k] if d in terms else s[:, k]
            return self._backward_sum(terms, s[:, 0])
        stack = namespace(s).stack
        return stack([self._forward(s[:, k], d)[d] for k, d in enumerate(self._degrees)], 1)

    def _products(self, batch: int, channels: int) -> float:
        return 2.0 * self._matrix.stored * batch * channels * max(self._degrees)

    def cost_each(self, batch: int, channels: int) -> Cost:
        D = max(self._degrees)
        return Cost(0.0, float(batch * (self.K + D) * self.N * channels), self._products(batch, channels))

    def cost_members(self, batch: int, channels: int, reduce: bool) -> Cost:
        D = max(self._degrees)
        factor = 1.0 if reduce else float(self.K)
        return Cost(0.0, float(batch * (self.K + D) * self.N * channels), factor * self._products(batch, channels))

    # --- materialising --------------------------------------------------------------------------
    def materialize(self) -> SparseBasis:
        """The members as one sparse basis, formed by sparse-sparse products (cached unless differentiable)."""
        if self._materialized is not None:
            return self._materialized
        import scipy.sparse

        S = self._matrix
        differentiable = is_torch(S.values) and S.values.requires_grad
        if is_torch(S.values):
            import torch

            narrow = S.values.device.type == "cpu" and S.values.dtype in (torch.bfloat16, torch.float16)
            if narrow:  # no low-precision sparse products on the CPU: form the members in float32
                with torch.autocast("cpu", enabled=False):
                    wide = PolynomialBasis(S.to(dtype=torch.float32), self._degrees, self._family).materialize()
                out = wide.to(dtype=S.values.dtype)
                if not differentiable:
                    self._materialized = out
                return out
            m = torch.sparse_coo_tensor(S.indices[1:], S.values, (S.M, S.N), check_invariants=True).coalesce()
            eye = torch.sparse_coo_tensor(
                torch.arange(S.M, device=m.device).repeat(2, 1),
                torch.ones(S.M, dtype=m.dtype, device=m.device),
                (S.M, S.M),
                check_invariants=True,
            )
            mats = [eye, m]
            for _ in range(2, max(self._degrees) + 1):
                with warnings.catch_warnings():  # torch's note that sparse CSR support is in beta
                    warnings.simplefilter("ignore", UserWarning)
                    nxt = torch.sparse.mm(mats[-1], m)
                mats.append((2 * nxt - mats[-2]).coalesce() if self._family == "chebyshev" else nxt.coalesce())
            parts = [mats[d].coalesce() for d in self._degrees]
            idx = torch.cat(
                [torch.cat([torch.full_like(p.indices()[:1], k), p.indices()]) for k, p in enumerate(parts)], 1
            )
            out = SparseBasis(idx, torch.cat([p.values() for p in parts]), self.shape)
        else:
            idx_np = S.indices
            m_np = scipy.sparse.csr_array((S.values, (idx_np[1], idx_np[2])), shape=(S.M, S.N))
            mats_np: list[Any] = [scipy.sparse.identity(S.M, dtype=S.values.dtype, format="csr"), m_np]
            for _ in range(2, max(self._degrees) + 1):
                nxt = mats_np[-1] @ m_np
                mats_np.append(2 * nxt - mats_np[-2] if self._family == "chebyshev" else nxt)
            out = SparseBasis.from_scipy([mats_np[d] for d in self._degrees]).to(dtype=S.values.dtype)
        if not differentiable:
            self._materialized = out
        return out

    def _estimated_nnz(self) -> float:
        """An upper estimate of the stored entries of every member (for the planner)."""
        N = self.N
        avg = max(self._matrix.stored / N, 1.0)
        return float(sum(min(N * N, N * avg**d if d else N) for d in self._degrees))

    def special_orders(self) -> tuple[str, ...]:
        return ("materialized",)

    def run_order(self, order: str, x: Array, theta: Array) -> Array | None:
        if order != "materialized":
            return None
        from ..engine.contract import conv

        result: Array = conv(self.materialize(), x, theta)
        return result

    def cost_order(self, order: str, batch: int, p: int, q: int) -> Cost | None:
        if order != "materialized":
            return None
        nnz = self._estimated_nnz()
        build = 0.0 if self._materialized is not None else 2.0 * self._matrix.stored * nnz
        channels = min(p, q)
        gemm = 2.0 * batch * self.N * self.K * p * q
        return Cost(gemm, float(nnz + batch * self.K * self.N * channels), build + 2.0 * nnz * batch * channels)

    # --- value operations ----------------------------------------------------------------------
    def to_dense(self) -> Array:
        S = self._matrix.to_dense()[0]
        lib = namespace(S)
        eye = lib.eye(S.shape[0], dtype=S.dtype, device=S.device) if is_torch(S) else np.eye(S.shape[0], dtype=S.dtype)
        mats = [eye, S]
        for _ in range(2, max(self._degrees) + 1):
            nxt = mats[-1] @ S
            mats.append(2 * nxt - mats[-2] if self._family == "chebyshev" else nxt)
        return lib.stack([mats[d] for d in self._degrees])

    def transpose(self) -> PolynomialBasis:
        r""":math:`p_d(S)^\top = p_d(S^\top)`."""
        return PolynomialBasis(self._matrix.transpose(), self._degrees, self._family)

    def select(self, members: Sequence[int]) -> PolynomialBasis:
        if not list(members):
            raise ValueError("members must name at least one basis member")
        return PolynomialBasis(self._matrix, [self._degrees[k] for k in members], self._family)

    def to(self, device: Any = None, dtype: Any = None) -> PolynomialBasis:
        return PolynomialBasis(self._matrix.to(device=device, dtype=dtype), self._degrees, self._family)

    def energy(self) -> float:
        return self.materialize().energy()

    def __repr__(self) -> str:
        return (
            f"PolynomialBasis(family={self._family!r}, degrees={self._degrees}, N={self.N}, "
            f"nnz(S)={self._matrix.stored}, backend={self.backend}, dtype={self.dtype})"
        )


# --- the builders --------------------------------------------------------------------------------------
def _check_K(K: Any, minimum: int) -> int:
    if isinstance(K, bool) or not isinstance(K, int | np.integer) or minimum > K:
        raise ValueError(f"K must be an integer >= {minimum}, got {K!r}")
    return int(K)


def gcn_basis(
    graph: Any,
    num_nodes: int | None = None,
    edge_weight: Array | None = None,
    improved: bool = False,
    add_self_loops: bool | None = None,
    normalize: bool = True,
    like: Array | None = None,
) -> SparseBasis:
    r"""The one-member GCN basis :math:`\tilde D^{-1/2}(A + I)\tilde D^{-1/2}` (Kipf & Welling).

    Matches PyG's ``gcn_norm``: self-loops are added only where missing (weight 2 when
    ``improved``), degrees are counted at the target, isolated nodes give 0.  With
    ``normalize=False`` the adjacency is used as is (self-loops are then added only if
    ``add_self_loops=True``; by default they go with the normalisation, as in PyG).

    Examples
    --------
    >>> import numpy as np
    >>> from structconv import gcn_basis
    >>> A = gcn_basis(np.array([[0, 1], [1, 0]]))            # one undirected edge
    >>> A.to_dense()[0]
    array([[0.5, 0.5],
           [0.5, 0.5]])
    """
    edges = as_edges(graph, num_nodes, edge_weight, like)
    if add_self_loops is None:
        add_self_loops = normalize
    if normalize:
        edges = gcn_normalize(edges, add_self_loops, improved)
    elif add_self_loops:
        edges = add_remaining_self_loops(edges, 2.0 if improved else 1.0)
    return edges.to_basis()


def graph_basis(
    graph: Any,
    kind: str = "gcn",
    K: int = 1,
    num_nodes: int | None = None,
    edge_weight: Array | None = None,
    normalization: str = "sym",
    lambda_max: float | str | None = None,
    edge_type: Array | None = None,
    num_relations: int | None = None,
    walks: Sequence[Sequence[int]] | None = None,
    like: Array | None = None,
) -> Basis:
    r"""A graph basis of one of :data:`KINDS`.

    ``"adjacency"``
        :math:`A` itself (one member).
    ``"gcn"``
        :func:`gcn_basis` (one member).
    ``"powers"``
        :math:`S^0, \dots, S^K` with :math:`S = D^{-1/2}AD^{-1/2}` (no added loops), as TAGConv;
        ``normalization="none"`` uses :math:`A`.
    ``"diffusion"``
        :math:`I`, then :math:`P_f^d` and :math:`P_b^d` for :math:`d = 1..K`, the forward and
        backward random-walk transitions (diffusion convolution; :math:`2K + 1` members).
    ``"chebyshev"``
        :math:`T_0(\hat L), \dots, T_{K-1}(\hat L)` of the scaled Laplacian
        (:func:`scaled_laplacian`, ``normalization`` ``"sym"`` or ``"rw"``), as ChebConv.
    ``"relational"``
        One member per relation (``edge_type`` in ``0..num_relations-1``), weighted
        :math:`1/|\mathcal N_r(n)|` (R-GCN's mean over each relation's in-neighbours), then one
        member per walk type in ``walks`` (a sequence of relations :math:`(r_1, \dots, r_L)` gives
        :math:`A_{r_1}\cdots A_{r_L}`, §2.2's knowledge-graph example).

    Polynomial kinds return a :class:`PolynomialBasis` (applied by repeated sparse products);
    the others a :class:`~structconv.SparseBasis`.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    edges = as_edges(graph, num_nodes, edge_weight, like)
    if kind == "adjacency":
        return edges.to_basis()
    if kind == "gcn":
        return gcn_normalize(edges).to_basis()
    if kind == "powers":
        K = _check_K(K, 1)
        if normalization == "sym":
            edges = gcn_normalize(edges, add_self_loops=False)
        elif normalization != "none":
            raise ValueError(f"normalization must be 'sym' or 'none' for powers, got {normalization!r}")
        return PolynomialBasis(edges.to_basis(), range(K + 1), "powers")
    if kind == "diffusion":
        from ..bases.composite import ConcatBasis

        K = _check_K(K, 1)
        forward = PolynomialBasis(walk_normalize(edges, "forward").to_basis(), range(K + 1), "powers")
        backward = PolynomialBasis(walk_normalize(edges, "backward").to_basis(), range(1, K + 1), "powers")
        return ConcatBasis([forward, backward])
    if kind == "chebyshev":
        K = _check_K(K, 1)
        laplacian, _ = scaled_laplacian(edges, normalization, lambda_max)
        return PolynomialBasis(laplacian.to_basis(), range(K), "chebyshev")
    return relational_basis(edges, edge_type, num_relations, walks)


def relational_basis(
    edges: Edges,
    edge_type: Array | None,
    num_relations: int | None,
    walks: Sequence[Sequence[int]] | None = None,
    root: bool = False,
    aggr: str = "mean",
) -> SparseBasis:
    r"""R-GCN members :math:`A_r[m, n] = 1/|\mathcal N_r(n)|` per relation, walk products, and optionally :math:`I`.

    ``aggr="sum"`` (or ``"add"``) gives every edge weight 1 instead of the mean's
    :math:`1/|\mathcal N_r(n)|`.  A bipartite ``edges`` (``num_targets`` set) gives members of
    shape ``(N_src, N_dst)``; ``walks`` and ``root`` need a square graph.
    """
    if aggr not in ("mean", "sum", "add"):
        raise ValueError(f"aggr must be 'mean', 'sum' or 'add' for a relational basis, got {aggr!r}")
    if edge_type is None:
        raise ValueError("kind='relational' needs edge_type, one relation number per edge")
    E = int(edges.src.shape[0])
    if tuple(edge_type.shape) != (E,) or not is_integer_array(edge_type):
        raise ValueError(f"edge_type must be an integer array of shape (E,) = ({E},), got {tuple(edge_type.shape)}")
    R = int(edge_type.max()) + 1 if num_relations is None else int(num_relations)
    if E and (int(edge_type.min()) < 0 or int(edge_type.max()) >= R):
        raise ValueError(
            f"edge_type must lie in [0, num_relations={R}), got [{int(edge_type.min())}, {int(edge_type.max())}]"
        )
    N, T = edges.num_nodes, edges.targets
    if (walks or root) and edges.num_targets is not None:
        raise ValueError("walks and root need a square graph, not a bipartite one (num_targets set)")
    torch_side = is_torch(edges.weight)
    etype: Any
    if torch_side:
        import torch

        etype = torch.as_tensor(edge_type, device=edges.src.device).long()
    else:
        etype = np.asarray(to_numpy(edge_type), dtype=np.int64)
    # Mean over each relation's in-neighbours: count incoming edges per (target, relation).
    if aggr == "mean":
        key = edges.dst * R + etype
        count = _scatter_sum(edges.weight * 0 + 1, key, T * R)
        values = edges.weight / count[key]
    else:
        values = edges.weight
    stack = namespace(edges.weight).stack
    members = R
    indices = [stack([etype, edges.src, edges.dst])]
    all_values = [values]
    if walks:
        import scipy.sparse

        t_np, v_np, s_np, d_np = to_numpy(etype), to_numpy(values), to_numpy(edges.src), to_numpy(edges.dst)
        mats = [
            scipy.sparse.csr_array((v_np[t_np == r], (s_np[t_np == r], d_np[t_np == r])), shape=(N, N))
            for r in range(R)
        ]
        for walk in walks:
            if not walk or any(not 0 <= int(r) < R for r in walk):
                raise ValueError(f"walks must be non-empty sequences of relations in [0, {R}), got {walk!r}")
            product = mats[int(walk[0])]
            for r in walk[1:]:
                product = product @ mats[int(r)]
            coo = scipy.sparse.coo_array(product)
            idx = np.stack([np.full(coo.nnz, members), coo.row, coo.col]).astype(np.int64)
            indices.append(_like_index(idx, edges.src))
            all_values.append(_like_values(coo.data, edges.weight))
            members += 1
    if root:
        nodes = np.arange(N)
        indices.append(_like_index(np.stack([np.full(N, members), nodes, nodes]), edges.src))
        all_values.append(_like_values(np.ones(N), edges.weight))
        members += 1
    return SparseBasis(_cat(indices, 1), _cat(all_values), (members, N, T))


def _like_index(a: np.ndarray, like: Array) -> Array:
    if is_torch(like):
        import torch

        return torch.as_tensor(a, dtype=torch.int64, device=like.device)
    return a.astype(np.int64)


def _like_values(a: np.ndarray, like: Array) -> Array:
    if is_torch(like):
        import torch

        return torch.as_tensor(a, dtype=like.dtype, device=like.device)
    return a.astype(like.dtype)
