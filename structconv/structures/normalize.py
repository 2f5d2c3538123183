r"""Normalisations of a graph's edge lists: self-loops, GCN's, random walks, Laplacians.

Each function takes and returns :class:`~structconv.structures.edge_list.Edges` on any backend,
differentiably in the weights; degrees of isolated nodes give zero weights, never ``inf``.
"""

from __future__ import annotations

import math

import numpy as np

from ..backend import Array, concatenate, device_of, namespace, of, to_numpy
from .edge_list import Edges


def _scatter_sum(values: Array, index: Array, size: int) -> Array:
    return of(values).scatter_add(values, index, size)


def _take(a: Array, index: Array) -> Array:
    """``a[index]`` (on torch through ``index_select``, whose backward is a scatter-add)."""
    return of(a).take(a, index, 0)


def _with_loops(edges: Edges, weight: Array, loops: Array) -> Edges:
    """The edges with ``weight``, then one loop per node with ``loops`` ``(N,)`` (nodes in order)."""
    nodes = namespace(edges.src).arange(edges.num_nodes, dtype=edges.src.dtype, device=device_of(edges.src))
    return edges.with_edges(
        concatenate([edges.src, nodes], 0), concatenate([edges.dst, nodes], 0), concatenate([weight, loops], 0)
    )


def _check_readable(edges: Edges, what: str) -> None:
    """Refuse edges on the meta device: ``what`` reads their values, which meta tensors do not hold."""
    if str(getattr(edges.weight, "device", "")) == "meta":  # an attribute, no dispatch: graph layers run this per call
        raise ValueError(
            f"the graph's edges are on the meta device (placed like x, or like=): {what} reads their values, which "
            "a meta tensor does not hold; read the graph with a real like and move the basis (Basis.to)"
        )


def _check_non_negative(edges: Edges, what: str) -> None:
    _check_readable(edges, what)
    of(edges.weight).check_all(
        edges.weight >= 0,
        f"edge weights (edge_weight, or the entries of a matrix graph) must be non-negative for {what} "
        "(degrees are square-rooted or inverted)",
    )


def _inverse(deg: Array, power: float) -> Array:
    """``deg ** -power`` with 0 where the degree is 0 (isolated nodes contribute nothing)."""
    positive = deg > 0
    # Isolated nodes are raised from 1, not 0, so that neither the value nor its gradient is inf.
    return (deg + ~positive) ** -power * positive


def add_remaining_self_loops(edges: Edges, *, fill: float = 1.0) -> Edges:
    """Give every node exactly one self-loop: keep an existing loop's weight, else use ``fill``.

    This is what PyG does to an ``edge_index`` (``add_remaining_self_loops``).

    Parameters
    ----------
    edges
        The graph, on any backend.
    fill
        The weight of the loops added (GCN's ``improved`` variant uses 2).

    Returns
    -------
    Edges
        The edges without their loops, then one loop per node (nodes in order).

    Raises
    ------
    ValueError
        If the edges are on the ``meta`` device (finding the loops reads them).
    """
    _check_readable(edges, "adding the remaining self-loops")
    backend = of(edges.weight)  # resolved once: a graph layer runs this on every call
    xp = backend.namespace()
    src, dst, weight = edges.src, edges.dst, edges.weight
    loop = src == dst
    loop_weight = xp.full((edges.num_nodes,), fill, dtype=weight.dtype, device=weight.device)
    if backend.traced():
        # Compiled, the edge count stays what it was (no host read, no data-dependent shape): an
        # existing loop stays in place with weight 0 and its weight moves to the node's loop; the
        # edges that are not loops write to a spare slot past the last node.
        spare = xp.concat([loop_weight, xp.zeros((1,), dtype=weight.dtype, device=weight.device)])
        spare[xp.where(loop, src, edges.num_nodes)] = weight
        loop_weight, weight = spare[: edges.num_nodes], xp.where(loop, xp.zeros_like(weight), weight)
    elif bool(loop.any()):  # one host read; a graph without loops (the usual case) is kept whole
        at, keep = xp.nonzero(loop)[0], xp.nonzero(~loop)[0]  # each mask resolved once, then gathers
        loop_weight[backend.take(src, at, 0)] = backend.take(weight, at, 0)
        src, dst, weight = backend.take(src, keep, 0), backend.take(dst, keep, 0), backend.take(weight, keep, 0)
    nodes = xp.arange(edges.num_nodes, dtype=src.dtype, device=src.device)
    return edges.with_edges(xp.concat([src, nodes]), xp.concat([dst, nodes]), xp.concat([weight, loop_weight]))


def add_self_loops(edges: Edges, *, fill: float = 1.0) -> Edges:
    r""":math:`A + \mathrm{fill}\cdot I`: a loop of weight ``fill`` on every node, added to any loop it already has.

    This is what PyG does to a sparse adjacency (``adj_t``); an ``edge_index`` instead gets
    :func:`add_remaining_self_loops`.

    Parameters
    ----------
    edges
        The graph, on any backend.
    fill
        The weight of the loops added.

    Returns
    -------
    Edges
        The edges, then one loop per node (nodes in order).
    """
    w = edges.weight
    return _with_loops(edges, w, namespace(w).full((edges.num_nodes,), fill, dtype=w.dtype, device=device_of(w)))


def remove_self_loops(edges: Edges) -> Edges:
    r"""The edges without their self-loops (``m -> m``), the others in their order.

    Parameters
    ----------
    edges
        The graph, on any backend.

    Returns
    -------
    Edges
        The edges ``m -> n`` with :math:`m \ne n` (under ``torch.compile``, every edge, the loops
        with weight 0: the same operator without a shape that depends on the edges' values).

    Raises
    ------
    ValueError
        If the edges are on the ``meta`` device (finding the loops reads them).
    """
    _check_readable(edges, "removing self-loops")
    keep = edges.src != edges.dst
    backend = of(edges.weight)
    if backend.traced():  # compiled: the same edges, the loops' weights 0 (no data-dependent shape)
        xp = backend.namespace()
        return edges.with_edges(edges.src, edges.dst, xp.where(keep, edges.weight, xp.zeros_like(edges.weight)))
    return edges.with_edges(edges.src[keep], edges.dst[keep], edges.weight[keep])


def gcn_normalize(edges: Edges, *, add_self_loops: bool = True, improved: bool = False) -> Edges:
    r""":math:`\tilde D^{-1/2}\tilde A\tilde D^{-1/2}` with :math:`\tilde A = A + I` (loops added where missing).

    Each edge :math:`m \to n` of weight :math:`a_{mn}` gets the weight
    :math:`\tilde d_m^{-1/2}\, a_{mn}\, \tilde d_n^{-1/2}`, with :math:`\tilde d_n = \sum_m \tilde a_{mn}`
    the in-degree (at the target) of :math:`\tilde A`; a node of degree 0 gives weight 0.

    Parameters
    ----------
    edges
        The graph, with non-negative weights.
    add_self_loops
        Give every node a loop first (:func:`add_remaining_self_loops`), as GCN does; ``False``
        normalises :math:`A` itself.
    improved
        Added loops weigh 2 instead of 1 (:math:`\tilde A = A + 2I`, Kipf and Welling's variant).

    Returns
    -------
    Edges
        The normalised edges, differentiable in the weights.

    Raises
    ------
    ValueError
        If a weight is negative, the edges are bipartite, or they are on the ``meta`` device.
    """
    if edges.num_targets not in (None, edges.num_nodes):
        raise ValueError(
            "gcn normalisation needs a square graph (it reads each node's degree as a target and as a source, "
            f"and adds self-loops); these edges are bipartite: {edges.num_nodes} sources, {edges.num_targets} targets"
        )
    _check_non_negative(edges, "gcn normalisation")
    if add_self_loops:
        edges = add_remaining_self_loops(edges, fill=2.0 if improved else 1.0)
    backend = of(edges.weight)
    dinv = _inverse(backend.scatter_add(edges.weight, edges.dst, edges.num_nodes), 0.5)
    weight = backend.take(dinv, edges.src, 0) * edges.weight * backend.take(dinv, edges.dst, 0)  # PyG's order
    return edges.with_edges(edges.src, edges.dst, weight)


def walk_normalize(edges: Edges, direction: str = "forward") -> Edges:
    r"""Random-walk averaging, as diffusion convolution (DCRNN) uses it.

    Parameters
    ----------
    edges
        The graph, with non-negative weights.
    direction
        ``"forward"`` gives :math:`y = D_{\mathrm{out}}^{-1}A\,x`: each node averages its
        out-neighbours (the member holds the reversed edges, since the formula gathers at
        targets); ``"backward"`` gives :math:`y = D_{\mathrm{in}}^{-1}A^\top x`: each node
        averages its in-neighbours.

    Returns
    -------
    Edges
        The averaging edges; a node without neighbours averages nothing (its row is 0).

    Raises
    ------
    ValueError
        For another ``direction``, a negative weight, or edges on the ``meta`` device.
    """
    _check_non_negative(edges, "random-walk normalisation")
    if direction == "forward":
        inv = _inverse(_scatter_sum(edges.weight, edges.src, edges.num_nodes), 1.0)
        return edges.with_edges(edges.dst, edges.src, _take(inv, edges.src) * edges.weight)
    if direction == "backward":
        inv = _inverse(_scatter_sum(edges.weight, edges.dst, edges.num_nodes), 1.0)
        return edges.with_edges(edges.src, edges.dst, _take(inv, edges.dst) * edges.weight)
    raise ValueError(f"direction must be 'forward' or 'backward', got {direction!r}")


def mean_normalize(edges: Edges) -> Edges:
    r"""Each target's mean over its in-edges: :math:`A_{mn} = w_{mn} / |\{e : e \to n\}|`.

    PyG's ``aggr="mean"`` (GraphSAGE): the mean of the messages a node receives, each edge
    counted once (a repeated edge twice), its weight (1 without ``edge_weight``) scaling its
    message.  A node without in-edges averages nothing (its column is 0).  Bipartite edges
    (``num_targets`` set) count at their targets.

    Parameters
    ----------
    edges
        The graph, on any backend.

    Returns
    -------
    Edges
        The same edges with the averaging weights.
    """
    ones = edges.weight * 0 + 1  # a count that stays on the weights' backend, dtype and device
    count = _scatter_sum(ones, edges.dst, edges.targets)
    return edges.with_edges(edges.src, edges.dst, _take(_inverse(count, 1.0), edges.dst) * edges.weight)


def identity_edges(edges: Edges) -> Edges:
    """Each target node's own features and nothing else: the identity member, one loop of weight 1 per target.

    Target :math:`n`'s own row is source :math:`S - T + n` (:math:`S` sources, :math:`T` targets):
    the node itself on a square graph, and on a bipartite one whose sources end with its
    targets (a layer's stacked input ``(x_src, x_dst)``), the target's row in ``x_dst``.

    Raises
    ------
    ValueError
        For a bipartite graph with fewer sources than targets, which has no such rows.
    """
    sources, targets = edges.num_nodes, edges.targets
    if sources < targets:
        raise ValueError(
            f"an identity member reads each target's own row, but this graph maps {sources} sources to {targets} "
            "targets; stack the targets' features after the sources' (a pair (x_src, x_dst) in a layer)"
        )
    xp = namespace(edges.src)
    nodes = xp.arange(targets, dtype=edges.src.dtype, device=device_of(edges.src))
    loops = namespace(edges.weight).ones((targets,), dtype=edges.weight.dtype, device=device_of(edges.weight))
    return edges.with_edges(nodes + (sources - targets), nodes, loops)


def laplacian(edges: Edges, normalization: str | None = "sym") -> Edges:
    r"""The graph Laplacian as edges: one loop per node plus the negated, normalised edges.

    Self-loops of the input are dropped first; degrees are out-degrees (at the source), as
    PyG's ``get_laplacian`` counts them.

    Parameters
    ----------
    edges
        The graph (non-negative weights for a normalised Laplacian).
    normalization
        ``"sym"`` for :math:`L = I - D^{-1/2}AD^{-1/2}`, ``"rw"`` for :math:`I - D^{-1}A`, or
        ``None`` for :math:`D - A`.

    Returns
    -------
    Edges
        The off-diagonal entries of :math:`L` (the edges, negated and normalised), then its
        diagonal as one loop per node.

    Raises
    ------
    ValueError
        For another ``normalization``, or a negative weight under a normalised one.
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
    return _with_loops(edges, off, diag)


def scaled_laplacian(
    edges: Edges, normalization: str = "sym", *, lambda_max: float | str | None = None
) -> tuple[Edges, float]:
    r"""The scaled Laplacian :math:`\hat L = 2L/\lambda_{\max} - I`, ChebConv's operator.

    Parameters
    ----------
    edges
        The graph, with non-negative weights.
    normalization
        ``"sym"`` for :math:`L = I - D^{-1/2}AD^{-1/2}` or ``"rw"`` for :math:`I - D^{-1}A`,
        from :func:`laplacian` (self-loops dropped, out-degrees).
    lambda_max
        :math:`\lambda_{\max}`: a positive finite number, ``None`` for 2 (the bound for
        ``"sym"``), or ``"auto"`` to compute the largest eigenvalue of :math:`L` (SciPy's
        ``eigs``, on the host).

    Returns
    -------
    (Edges, float)
        :math:`\hat L` and the :math:`\lambda_{\max}` used.

    Raises
    ------
    ValueError
        For another ``normalization`` or ``lambda_max``, or a negative weight.
    """
    if normalization not in ("sym", "rw"):
        raise ValueError(f"normalization must be 'sym' or 'rw', got {normalization!r}")
    lap = laplacian(edges, normalization)
    if lambda_max is None:
        lam = 2.0
    elif lambda_max == "auto":
        lam = _largest_eigenvalue(lap)
    elif isinstance(lambda_max, int | float) and not isinstance(lambda_max, bool) and 0 < lambda_max < math.inf:
        lam = float(lambda_max)
    else:
        raise ValueError(f"lambda_max must be a positive number (finite), 'auto' or None, got {lambda_max!r}")
    scaled = lap.weight * (2.0 / lam)
    is_loop = lap.src == lap.dst
    scaled = namespace(scaled).where(is_loop, scaled - 1.0, scaled)
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
