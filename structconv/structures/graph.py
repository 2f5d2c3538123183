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

The graph's input forms are read by :mod:`~structconv.structures.edge_list` and normalised by
:mod:`~structconv.structures.normalize`; polynomial members are a
:class:`~structconv.bases.polynomial.PolynomialBasis`.  This module builds the bases.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..backend import Array, as_index, concatenate, device_of, find, is_integer_array, namespace, of, to_numpy
from ..backend.checks import check_index_range
from ..bases.base import Basis
from ..bases.polynomial import PolynomialBasis
from ..bases.sparse import MAX_ENTRIES, SparseBasis
from .edge_list import Edges, as_edges, checked_basis, host_like, is_matrix_graph, members_basis
from .normalize import (
    _largest_eigenvalue,
    add_remaining_self_loops,
    add_self_loops,
    gcn_normalize,
    identity_edges,
    laplacian,
    mean_normalize,
    remove_self_loops,
    scaled_laplacian,
    walk_normalize,
)

_add_loops = add_self_loops  # gcn_edges' argument of the same name hides it there

KINDS = ("adjacency", "identity", "mean", "gin", "gcn", "powers", "chebyshev", "diffusion", "relational")

#: The one-member kinds, which a sequence ``kind`` stacks into one basis (``("mean", "identity")``: GraphSAGE).
EDGE_KINDS = ("adjacency", "identity", "mean", "gcn")


# --- the builders --------------------------------------------------------------------------------------
def gcn_edges(
    edges: Edges, *, matrix: bool, weighted: bool, improved: bool, add_self_loops: bool, normalize: bool
) -> Edges:
    r"""The GCN rule, PyG's ``gcn_norm``, used by :func:`gcn_basis` and the layers alike.

    Self-loops first, when ``add_self_loops``: a sparse adjacency (``matrix``) gets
    :math:`A + fI`, an ``edge_index`` a loop of weight :math:`f` on every node without one (a
    loop it has keeps its weight), with :math:`f = 2` for ``improved`` and 1 otherwise.  Then,
    when ``normalize``, :math:`\tilde D^{-1/2}\tilde A\tilde D^{-1/2}` with in-degrees.

    PyG fills the loops of an ``edge_index`` given without ``edge_weight`` with 1 even when
    ``improved``; this rule does the same, so that a basis and a layer equal PyG's on the same
    arguments, and says so with a :class:`UserWarning`.  Pass ``edge_weight`` (ones) for the
    loops of weight 2 of the improved GCN.

    Parameters
    ----------
    edges
        The graph as read by :func:`~structconv.structures.edge_list.as_edges`.
    matrix
        Whether it was given as an adjacency matrix (dense, SciPy or torch sparse).
    weighted
        Whether ``edge_weight`` was given (an ``edge_index`` only).
    improved, add_self_loops, normalize
        As PyG's ``gcn_norm`` / ``GCNConv``.

    Returns
    -------
    Edges
        The graph of the one GCN member :math:`\hat A`.
    """
    if add_self_loops:
        fill = 2.0 if improved else 1.0
        if matrix:
            edges = _add_loops(edges, fill=fill)
        else:
            if improved and not weighted:
                if not of(edges.weight).traced():  # torch.compile cannot trace a warning: eager calls give it
                    warnings.warn(
                        "improved=True on an edge_index without edge_weight adds self-loops of weight 1, as PyG's "
                        "gcn_norm does; pass edge_weight (e.g. ones) for the improved GCN's loops of weight 2",
                        UserWarning,
                        stacklevel=3,
                    )
                fill = 1.0
            edges = add_remaining_self_loops(edges, fill=fill)
    return gcn_normalize(edges, add_self_loops=False) if normalize else edges


def gcn_basis(
    graph: Any,
    num_nodes: int | None = None,
    *,
    edge_weight: Array | None = None,
    improved: bool = False,
    add_self_loops: bool | None = None,
    normalize: bool = True,
    like: Array | None = None,
) -> SparseBasis:
    r"""The one-member GCN basis :math:`\tilde D^{-1/2}(A + I)\tilde D^{-1/2}` (Kipf & Welling).

    The same rule as :class:`structconv.nn.GCNConv` and PyG's ``gcn_norm``
    (:func:`gcn_edges`): self-loops are added only where missing for an ``edge_index`` (all of
    them, :math:`A + I`, for an adjacency matrix), degrees are counted at the target, isolated
    nodes give 0.

    Parameters
    ----------
    graph
        An ``edge_index`` ``(2, E)`` (sources, targets), or an adjacency matrix ``(N, N)``
        (dense, ``scipy.sparse`` or torch sparse; entry :math:`(m, n)` is the edge :math:`m \to n`).
    num_nodes
        :math:`N`; by default one more than the largest node number (or the matrix' size).
    edge_weight
        ``(E,)`` non-negative weights of an ``edge_index``.
    improved
        Self-loops of weight 2 (:math:`A + 2I`); on an ``edge_index`` only with ``edge_weight``,
        as in PyG (a warning says so otherwise).
    add_self_loops
        Add the loops; by default they go with ``normalize``, as in PyG.
    normalize
        Apply :math:`\tilde D^{-1/2}\cdot\tilde D^{-1/2}`; ``False`` keeps the adjacency as is.
    like
        An array whose backend, dtype and device the basis takes (default: the graph's).

    Returns
    -------
    SparseBasis
        One member, shape ``(1, N, N)``.

    Examples
    --------
    >>> import numpy as np
    >>> from structconv import gcn_basis
    >>> A = gcn_basis(np.array([[0, 1], [1, 0]]))            # one undirected edge
    >>> A.to_dense()[0]
    array([[0.5, 0.5],
           [0.5, 0.5]])
    """
    host = host_like(like, graph, edge_weight)
    if host is not like:  # a meta like: normalised where the graph's values are, then placed
        again = gcn_basis(graph, num_nodes, edge_weight=edge_weight, improved=improved, add_self_loops=add_self_loops,
                          normalize=normalize, like=host)  # fmt: skip
        return again.to(device_of(like))
    edges = as_edges(graph, num_nodes, edge_weight, like=like)
    loops = normalize if add_self_loops is None else add_self_loops
    matrix, weighted = is_matrix_graph(graph), edge_weight is not None
    rule = {"improved": improved, "add_self_loops": loops, "normalize": normalize}
    return gcn_edges(edges, matrix=matrix, weighted=weighted, **rule).to_basis()


def graph_basis(
    graph: Any,
    kind: str | Sequence[str] = "gcn",
    *,
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
    r"""A graph basis of one of :data:`KINDS`, or of one-member kinds stacked (a sequence of :data:`EDGE_KINDS`).

    ``"adjacency"``
        :math:`A` itself (one member).
    ``"identity"``
        :math:`I` on the graph's nodes (one member): a node's own features, the root term of
        GraphSAGE and GraphConv.
    ``"mean"``
        :math:`A` over each target's in-degree, :math:`A_{mn} = w_{mn}/|\{e \to n\}|`
        (one member; :func:`~structconv.structures.normalize.mean_normalize`): the mean of the
        in-neighbours, PyG's ``aggr="mean"`` (GraphSAGE).
    ``"gin"``
        :math:`[I, A]` (two members): GIN's :math:`(1 + \epsilon)x_n + \sum_{m \to n} x_m` with
        :math:`\Theta = (1 + \epsilon, 1)` (an :class:`~structconv.Aggregation`, or a
        :class:`~structconv.Separable` for a linear GIN).
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

    Parameters
    ----------
    graph
        An ``edge_index`` ``(2, E)`` (sources, targets), an adjacency matrix ``(N, N)`` (dense,
        ``scipy.sparse`` or torch sparse; entry :math:`(m, n)` is the edge :math:`m \to n`), or
        the :class:`~structconv.structures.graph.Edges` a :class:`~structconv.nn.GraphLayer`
        hands its ``graph_basis``.
    kind
        One of :data:`KINDS` (above), or a sequence of :data:`EDGE_KINDS`: one member each, in
        that order (``("mean", "identity")`` is GraphSAGE's :math:`[D_{in}^{-1}A, I]`).
    K
        The order: the largest power (``"powers"``, ``"diffusion"``) or the number of
        Chebyshev members (``"chebyshev"``); unused by the one-member kinds.
    num_nodes
        :math:`N`; by default one more than the largest node number (or the matrix' size).
    edge_weight
        ``(E,)`` non-negative weights of an ``edge_index``.
    normalization
        ``"sym"`` or ``"rw"`` (Chebyshev's Laplacian), ``"sym"`` or ``"none"`` (powers).
    lambda_max
        The largest eigenvalue of the Laplacian for ``"chebyshev"``: a number, ``"estimate"``, or
        ``None`` for the bound 2 (as PyG's ChebConv).
    edge_type
        ``(E,)`` relation of each edge (``"relational"``), in ``0..num_relations-1``.
    num_relations
        The number of relations :math:`R` (``"relational"``); by default one more than the largest.
    walks
        Walk types for ``"relational"``: each a sequence of relations, one member per walk.
    like
        An array whose backend, dtype and device the basis takes (default: the graph's).

    Returns
    -------
    Basis
        ``(K', N, N)`` with :math:`K'` members as listed for ``kind``.
    """
    stack = tuple(kind) if isinstance(kind, tuple | list) else None
    if stack is not None:
        if not stack or any(k not in EDGE_KINDS for k in stack):
            raise ValueError(f"kind as a sequence stacks one-member kinds, each one of {EDGE_KINDS}; got {kind!r}")
    elif kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS} or a sequence of {EDGE_KINDS}, got {kind!r}")
    host = host_like(like, graph, edge_weight, edge_type)
    if host is not like:  # a meta like: built where the graph's values are, then placed
        again = graph_basis(
            graph, kind, K=K, num_nodes=num_nodes, edge_weight=edge_weight, normalization=normalization,
            lambda_max=lambda_max, edge_type=edge_type, num_relations=num_relations, walks=walks, like=host,
        )  # fmt: skip
        return again.to(device_of(like))
    edges = as_edges(graph, num_nodes, edge_weight, like=like)
    if kind in ("powers", "diffusion", "chebyshev"):
        if isinstance(K, bool) or not isinstance(K, int | np.integer) or K < 1:
            raise ValueError(f"K must be an integer >= 1, got {K!r}")
        K = int(K)
        # A huge K is held lazily (the degrees are a range), up to what SparseBasis' int64 numbering allows
        members, size = {"powers": K + 1, "diffusion": 2 * K + 1, "chebyshev": K}[kind], edges.num_nodes * edges.targets
        if members * size > MAX_ENTRIES:
            raise ValueError(
                f"K={K} gives {members} members of {edges.num_nodes} x {edges.targets} nodes, more entries than int64 "
                f"can number ({MAX_ENTRIES})"
            )
    if stack is not None:
        return members_basis([_member(edges, k) for k in stack])
    if kind == "adjacency":
        return edges.to_basis()
    if kind in ("identity", "mean"):
        return checked_basis(_member(edges, kind))
    if kind == "gin":
        return members_basis([identity_edges(edges), edges])
    if kind == "gcn":
        return gcn_normalize(edges).to_basis()
    if kind == "powers":
        if normalization == "sym":
            edges = gcn_normalize(edges, add_self_loops=False)
        elif normalization != "none":
            raise ValueError(f"normalization must be 'sym' or 'none' for powers, got {normalization!r}")
        return PolynomialBasis(edges.to_basis(), range(K + 1), "powers")
    if kind == "diffusion":
        from ..bases.composite import ConcatBasis

        forward = PolynomialBasis(walk_normalize(edges, "forward").to_basis(), range(K + 1), "powers")
        backward = PolynomialBasis(walk_normalize(edges, "backward").to_basis(), range(1, K + 1), "powers")
        return ConcatBasis([forward, backward])
    if kind == "chebyshev":
        laplacian, _ = scaled_laplacian(edges, normalization, lambda_max=lambda_max)
        return PolynomialBasis(laplacian.to_basis(), range(K), "chebyshev")
    return relational_basis(edges, edge_type, num_relations, walks)


def _member(edges: Edges, kind: str) -> Edges:
    """The edges of the one-member ``kind`` (:data:`EDGE_KINDS`) on ``edges``."""
    if kind == "identity":
        return identity_edges(edges)
    if kind == "mean":
        return mean_normalize(edges)
    return gcn_normalize(edges) if kind == "gcn" else edges


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
        raise ValueError(
            "a relational basis needs edge_type, one relation number per edge; for a mean over all in-neighbours "
            "use graph_basis(graph, 'mean'), and 'identity' for the root term"
        )
    E = int(edges.src.shape[0])
    if tuple(edge_type.shape) != (E,) or not is_integer_array(edge_type):
        raise ValueError(f"edge_type must be an integer array of shape (E,) = ({E},), got {tuple(edge_type.shape)}")
    if device_of(edge_type) == "meta":  # worded as backend.checks.check_readable words it
        raise ValueError(
            "edge_type is on the meta device: building a relational basis (the relation numbers are checked) reads "
            "its values, which a meta tensor does not hold"
        )
    if num_relations is None and E == 0:
        raise ValueError(
            "num_relations is needed for a graph without edges: the relations cannot be counted from an empty "
            "edge_type; pass num_relations=R"
        )
    R = int(edge_type.max()) + 1 if num_relations is None else int(num_relations)
    check_index_range(edge_type, R, "edge_type", "num_relations")
    N, T = edges.num_nodes, edges.targets
    if (walks or root) and edges.num_targets is not None:
        raise ValueError("walks and root need a square graph, not a bipartite one (num_targets set)")
    etype = as_index(edge_type if find(edge_type) is of(edges.src) else to_numpy(edge_type), edges.src)
    # Mean over each relation's in-neighbours: count incoming edges per (target, relation).
    if aggr == "mean":
        key = edges.dst * R + etype
        count = of(edges.weight).scatter_add(edges.weight * 0 + 1, key, T * R)
        values = edges.weight / count[key]
    else:
        values = edges.weight
    stack = namespace(edges.weight).stack
    members = R
    indices = [stack([etype, edges.src, edges.dst])]
    all_values = [values]
    weights = of(edges.weight)
    if walks:
        if device_of(values) == "meta":
            raise ValueError(
                "like is on the meta device: walks (products of relations, formed with SciPy) read the edges' "
                "values, which a meta tensor does not hold; build the basis with a real like and move it (Basis.to)"
            )
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
            indices.append(as_index(np.stack([np.full(coo.nnz, members), coo.row, coo.col]), edges.src))
            all_values.append(weights.asarray(coo.data, edges.weight))
            members += 1
    if root:
        nodes = np.arange(N)
        indices.append(as_index(np.stack([np.full(N, members), nodes, nodes]), edges.src))
        all_values.append(weights.asarray(np.ones(N), edges.weight))
        members += 1
    index, value = concatenate(indices, 1), concatenate(all_values, 0)
    if device_of(value) == "meta":  # edges placed on meta (like a layer's x): built from checked parts
        return SparseBasis._from_checked(index, value, (members, N, T))
    return SparseBasis(index, value, (members, N, T))


# Names the graph layers and older code import from here (their homes are edge_list, normalize
# and bases.polynomial); ``_largest_eigenvalue`` serves ChebConv's ``lambda_max="auto"``.
__all__ = [
    "EDGE_KINDS",
    "KINDS",
    "Edges",
    "PolynomialBasis",
    "_largest_eigenvalue",
    "add_remaining_self_loops",
    "add_self_loops",
    "as_edges",
    "gcn_basis",
    "gcn_edges",
    "gcn_normalize",
    "graph_basis",
    "host_like",
    "is_matrix_graph",
    "laplacian",
    "relational_basis",
    "remove_self_loops",
    "scaled_laplacian",
    "walk_normalize",
]
