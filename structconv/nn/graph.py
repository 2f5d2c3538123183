r"""Graph layers shaped like PyTorch Geometric's, each a graph basis plus :math:`\Theta`.

Every layer takes node features ``x`` of shape ``(N, P)`` and a graph: an ``edge_index``
``(2, E)`` (with optional ``edge_weight``), a sparse adjacency, or a prebuilt
:class:`~structconv.Basis`.  The basis is rebuilt on every call from a raw graph; no layer caches
it.  To reuse a normalised basis, build it once (e.g. :func:`structconv.gcn_basis`) and pass it
instead of ``edge_index``.

**Orientation.**  As in PyG, row 0 of an ``edge_index`` holds sources and row 1 targets, and a
matrix graph (torch sparse COO/CSR/CSC, ``scipy.sparse`` or a dense floating matrix) is PyG's
``adj_t``: entry ``[i, j]`` weighs the edge :math:`j \to i` (row = target, column = source), so
``layer(x, adj.t())`` equals ``layer(x, edge_index)`` for ``adj`` built from ``edge_index``.
(The basis builders of :mod:`structconv.structures.graph` read a matrix as the adjacency itself, ``[m, n]``
for :math:`m \to n`, unless given ``adj_t=True``.)  PyG's ``EdgeIndex`` is an ``edge_index``.

**Self-loops.**  Where a layer adds self-loops (GCN, SG), an ``edge_index`` gets PyG's
*remaining* loops (a node's existing loop keeps its weight; ``improved`` gives added loops weight
2 only when ``edge_weight`` is given), while a matrix graph gets :math:`A + I` (``2I`` when
``improved``), summed with existing loops, as PyG's ``gcn_norm`` does for sparse input.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from ..bases.base import Basis
from ..bases.edges import EdgeBasis
from ..bases.factor import LowRank, Separable
from ..engine.contract import conv
from ..structures.graph import (
    Edges,
    PolynomialBasis,
    _largest_eigenvalue,
    add_remaining_self_loops,
    add_self_loops,
    as_edges,
    gcn_normalize,
    is_matrix_graph,
    laplacian,
    relational_basis,
)

FLOWS = ("source_to_target", "target_to_source")


def glorot_(t: torch.Tensor) -> None:
    r"""Glorot-uniform over the last two axes, :math:`\mathcal U(\pm\sqrt{6/(a + b)})` for an ``(a, b)`` matrix."""
    bound = math.sqrt(6.0 / (t.shape[-2] + t.shape[-1]))
    nn.init.uniform_(t, -bound, bound)


def _features(x: Any, channels: int, layer: str, static: bool = True) -> torch.Tensor:
    """Node features as a dense ``(N, P)`` (or, if ``static``, ``(B, N, P)``) tensor; sparse ``x`` is densified."""
    ranks = (2, 3) if static else (2,)
    if not isinstance(x, torch.Tensor) or x.ndim not in ranks:
        shape = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        form = f"(N, {channels}) or a static batch (B, N, {channels})" if static else f"(N, {channels})"
        raise ValueError(f"{layer}: x must be node features of shape {form}, got {shape}")
    if x.layout != torch.strided:  # sparse node features, as PyG's Linear accepts them
        x = x.to_dense()
    if int(x.shape[-1]) != channels:
        raise ValueError(
            f"{layer}: x has {int(x.shape[-1])} channels (dim {x.ndim - 1}) but the layer expects {channels}"
        )
    dense: torch.Tensor = x
    return dense


def _check_basis(basis: Basis, x: torch.Tensor, layer: str) -> Basis:
    if int(x.shape[-2]) != basis.M:
        raise ValueError(f"{layer}: x has {int(x.shape[-2])} rows (nodes) but the graph basis has {basis.M} nodes")
    return basis


def _positive(value: Any, name: str, layer: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ValueError(f"{layer}: {name} must be a positive integer, got {value!r}")
    return int(value)


def _check_flow(flow: Any, layer: str) -> str:
    if flow not in FLOWS:
        raise ValueError(f"{layer}: flow must be one of {FLOWS}, got {flow!r}")
    return str(flow)


def _flip(graph: Any, flow: str, layer: str) -> Any:
    """The ``edge_index`` as source-to-target: reversed for ``flow="target_to_source"``."""
    if flow == "source_to_target" or isinstance(graph, Basis):
        return graph
    if is_matrix_graph(graph):
        raise ValueError(
            f"{layer}: flow='target_to_source' needs an edge_index; for a sparse adjacency pass its "
            "transpose instead (as PyG requires)"
        )
    return graph.flip(0) if isinstance(graph, torch.Tensor) else graph[::-1]


def _read(graph: Any, x: torch.Tensor, edge_weight: torch.Tensor | None, layer: str) -> Edges:
    """The graph as edges on ``x``'s nodes, a matrix read as PyG's ``adj_t``."""
    if edge_weight is not None and is_matrix_graph(graph):
        raise ValueError(f"{layer}: edge_weight goes with an edge_index; a sparse adjacency carries its own weights")
    return as_edges(graph, int(x.shape[-2]), edge_weight, like=x, adj_t=True)


def _check_empty(graph: Any, layer: str) -> None:
    """A graph on zero nodes must have no edges."""
    edges = int(graph.shape[1]) if not is_matrix_graph(graph) and graph.ndim == 2 else 0
    if edges:
        raise ValueError(f"{layer}: x has 0 nodes but edge_index has {edges} edges")


def _gcn_edges(
    edges: Edges, matrix: bool, weighted: bool, improved: bool, loops: bool, normalize: bool = True
) -> Edges:
    """PyG's ``gcn_norm``: loops (remaining for an ``edge_index``, :math:`+I` for a matrix), then the normalisation."""
    if loops:
        if matrix:
            edges = add_self_loops(edges, 2.0 if improved else 1.0)
        else:  # PyG's add_remaining_self_loops uses the fill value only when there are edge weights
            edges = add_remaining_self_loops(edges, 2.0 if improved and weighted else 1.0)
    return gcn_normalize(edges, add_self_loops=False) if normalize else edges


class _GraphLayer(nn.Module):
    def __init__(self, in_channels: int, out_channels: int, members: int, bias: bool, flow: str) -> None:
        super().__init__()
        name = type(self).__name__
        self.in_channels = _positive(in_channels, "in_channels", name)
        self.out_channels = _positive(out_channels, "out_channels", name)
        self.flow = _check_flow(flow, name)
        self.theta = nn.Parameter(torch.empty(members, in_channels, out_channels))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None

    def reset_parameters(self) -> None:
        """Glorot weights and a zero bias (PyG's default for these layers)."""
        glorot_(self.theta)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _basis(self, x: torch.Tensor, graph: Any, edge_weight: torch.Tensor | None) -> Basis:
        raise NotImplementedError

    def _run(self, x: Any, edge_index: Any, edge_weight: torch.Tensor | None, **extra: Any) -> torch.Tensor:
        name = type(self).__name__
        x = _features(x, self.in_channels, name)
        if isinstance(edge_index, Basis):
            if edge_weight is not None:
                raise ValueError(f"{name}: edge_weight goes with an edge_index, not with a prebuilt basis")
            basis = edge_index
        elif int(x.shape[-2]) == 0:  # a graph without nodes: an empty output
            _check_empty(edge_index, name)
            y0: torch.Tensor = x @ self.theta.sum(0)
            return y0 if self.bias is None else y0 + self.bias
        else:
            basis = self._basis(x, _flip(edge_index, self.flow, name), edge_weight, **extra)
        y: torch.Tensor = conv(_check_basis(basis, x, name), x, self.theta)
        return y if self.bias is None else y + self.bias

    def forward(self, x: torch.Tensor, edge_index: Any, edge_weight: torch.Tensor | None = None) -> torch.Tensor:
        """Apply the layer to ``x`` (``(N, P)`` or ``(B, N, P)``) on ``edge_index`` (or a prebuilt basis)."""
        return self._run(x, edge_index, edge_weight)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, K={self.theta.shape[0]}, bias={self.bias is not None}"


class GCNConv(_GraphLayer):
    r"""Graph convolution of Kipf & Welling: :math:`y = \hat A^\top x\,\Theta + \beta`, one member.

    :math:`\hat A = \tilde D^{-1/2}(A + I)\tilde D^{-1/2}` (:func:`structconv.gcn_basis`).  With
    :math:`K = 1` every neighbour shares one channel map, which is what limits GCN: it can
    only average its neighbourhood, never tell neighbours apart.  Arguments as PyG's
    ``GCNConv`` (no ``cached``: pass a prebuilt basis instead); ``flow`` as PyG's.  Self-loops
    and ``improved`` as PyG's ``gcn_norm`` (see the module notes).  ``x`` may be sparse
    (densified) or a static batch ``(B, N, P)``.  Glorot weights, zero bias.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        improved: bool = False,
        add_self_loops: bool | None = None,
        normalize: bool = True,
        bias: bool = True,
        flow: str = "source_to_target",
    ) -> None:
        super().__init__(in_channels, out_channels, 1, bias, flow)
        if add_self_loops is None:  # as PyG: loops go with the normalisation
            add_self_loops = normalize
        elif add_self_loops and not normalize:
            raise ValueError("GCNConv: add_self_loops=True needs normalize=True (as in PyG)")
        self.improved, self.add_self_loops, self.normalize = improved, add_self_loops, normalize
        self.reset_parameters()

    def _basis(self, x: torch.Tensor, graph: Any, edge_weight: torch.Tensor | None) -> Basis:
        edges = _read(graph, x, edge_weight, "GCNConv")
        matrix = is_matrix_graph(graph)
        loops = self.add_self_loops and self.normalize
        return _gcn_edges(edges, matrix, edge_weight is not None, self.improved, loops, self.normalize).to_basis()


class TAGConv(_GraphLayer):
    r"""Topology-adaptive graph convolution (Du et al.): :math:`y = \sum_{k=0}^{K} (S^k)^\top x\,\Theta_k + \beta`.

    :math:`S = D^{-1/2}AD^{-1/2}` without added loops; the basis is a
    :class:`~structconv.PolynomialBasis` applied by repeated sparse products.  Weights as
    ``torch.nn.Linear`` (as PyG's ``TAGConv``), zero bias; ``x`` may be ``(B, N, P)``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        K: int = 3,
        bias: bool = True,
        normalize: bool = True,
        flow: str = "source_to_target",
    ) -> None:
        self.K = _positive(K, "K", "TAGConv")
        super().__init__(in_channels, out_channels, K + 1, bias, flow)
        self.normalize = normalize
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for k in range(self.theta.shape[0]):  # each member like an nn.Linear(in, out) weight
            nn.init.kaiming_uniform_(self.theta.data[k].T, a=math.sqrt(5))
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _basis(self, x: torch.Tensor, graph: Any, edge_weight: torch.Tensor | None) -> Basis:
        edges = _read(graph, x, edge_weight, "TAGConv")
        if self.normalize:
            edges = gcn_normalize(edges, add_self_loops=False)
        return PolynomialBasis(edges.to_basis(), range(self.K + 1), "powers")


class SGConv(_GraphLayer):
    r"""Simple graph convolution (Wu et al.): one member :math:`\hat A^K`, :math:`y = (\hat A^K)^\top x\Theta + \beta`.

    Weights and bias as ``torch.nn.Linear`` (as PyG's ``SGConv``); self-loops as
    :class:`GCNConv`'s.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        K: int = 1,
        add_self_loops: bool = True,
        bias: bool = True,
        flow: str = "source_to_target",
    ) -> None:
        self.K = _positive(K, "K", "SGConv")
        super().__init__(in_channels, out_channels, 1, bias, flow)
        self.add_self_loops = add_self_loops
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.kaiming_uniform_(self.theta.data[0].T, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_channels)
            nn.init.uniform_(self.bias, -bound, bound)

    def _basis(self, x: torch.Tensor, graph: Any, edge_weight: torch.Tensor | None) -> Basis:
        edges = _read(graph, x, edge_weight, "SGConv")
        edges = _gcn_edges(edges, is_matrix_graph(graph), edge_weight is not None, False, self.add_self_loops)
        return PolynomialBasis(edges.to_basis(), [self.K], "powers")


class ChebConv(_GraphLayer):
    r"""Chebyshev spectral convolution (Defferrard et al.): :math:`y = \sum_{k<K} T_k(\hat L)^\top x\,\Theta_k + \beta`.

    :math:`\hat L = 2L/\lambda_{\max} - I` with :math:`L` of :func:`structconv.structures.graph.laplacian`
    (``normalization`` ``"sym"``, ``"rw"`` or ``None`` for :math:`D - A`).  :math:`\lambda_{\max}`
    is, first found: the ``lambda_max`` of :meth:`forward` (a number, or one value per graph of
    a ``batch``), the constructor's ``lambda_max`` (a number or ``"auto"``, computed), or PyG's
    default, twice the largest entry of :math:`L` (2 for ``sym`` and ``rw``).  Glorot weights,
    zero bias, as PyG's ``ChebConv``.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        K: int,
        normalization: str | None = "sym",
        bias: bool = True,
        lambda_max: float | str | None = None,
    ) -> None:
        self.K = _positive(K, "K", "ChebConv")
        if normalization not in ("sym", "rw", None):
            raise ValueError(f"ChebConv: normalization must be 'sym', 'rw' or None, got {normalization!r}")
        if (
            lambda_max is not None
            and lambda_max != "auto"
            and (isinstance(lambda_max, bool) or not isinstance(lambda_max, int | float) or lambda_max <= 0)
        ):
            raise ValueError(f"ChebConv: lambda_max must be a positive number, 'auto' or None, got {lambda_max!r}")
        super().__init__(in_channels, out_channels, K, bias, "source_to_target")
        self.normalization, self.lambda_max = normalization, lambda_max
        self.reset_parameters()

    def forward(
        self,
        x: torch.Tensor,
        edge_index: Any,
        edge_weight: torch.Tensor | None = None,
        batch: torch.Tensor | None = None,
        lambda_max: torch.Tensor | float | None = None,
    ) -> torch.Tensor:
        """Apply the layer; ``batch`` (``(N,)`` graph of each node) goes with a per-graph ``lambda_max``."""
        if isinstance(edge_index, Basis) and (batch is not None or lambda_max is not None):
            raise ValueError("ChebConv: batch and lambda_max go with an edge_index, not with a prebuilt basis")
        return self._run(x, edge_index, edge_weight, batch=batch, lambda_max=lambda_max)

    def _basis(
        self,
        x: torch.Tensor,
        graph: Any,
        edge_weight: torch.Tensor | None,
        batch: torch.Tensor | None = None,
        lambda_max: torch.Tensor | float | None = None,
    ) -> Basis:
        lap = laplacian(_read(graph, x, edge_weight, "ChebConv"), self.normalization)
        w = lap.weight
        lam: Any = lambda_max if lambda_max is not None else self.lambda_max
        if lam is None:
            lam = 2.0 * w.max()  # PyG's default (differentiable, as PyG's)
            if float(lam.detach()) <= 0:
                raise ValueError(
                    "ChebConv: the default lambda_max, twice the largest entry of L, is 0 (normalization=None "
                    "on a graph without edges); pass lambda_max"
                )
        elif isinstance(lam, str):
            lam = torch.tensor(_largest_eigenvalue(lap), dtype=w.dtype, device=w.device)
        else:
            lam = torch.as_tensor(lam, dtype=w.dtype, device=w.device)
            if lam.numel() > 1:
                N = int(x.shape[-2])
                if batch is None or tuple(batch.shape) != (N,):
                    raise ValueError(
                        f"ChebConv: lambda_max with {lam.numel()} values (one per graph) needs batch, the graph "
                        f"of each node, of shape ({N},)"
                    )
                lam = lam.reshape(-1).index_select(0, batch.long().index_select(0, lap.src))
            elif lam.numel() == 0 or float(lam.reshape(-1)[0]) <= 0:
                raise ValueError(f"ChebConv: lambda_max must be positive, got {lambda_max!r}")
        scaled = (2.0 * w) / lam
        scaled = scaled.masked_fill(scaled == math.inf, 0.0)
        scaled = scaled - (lap.src == lap.dst).to(scaled.dtype)
        edges = lap.with_edges(lap.src, lap.dst, scaled)
        return PolynomialBasis(edges.to_basis(), range(self.K), "chebyshev")


def _pair(channels: int | tuple[int, int], layer: str) -> tuple[int, int]:
    """``in_channels`` as ``(source, target)`` channels."""
    if isinstance(channels, tuple | list):
        if len(channels) != 2:
            raise ValueError(f"{layer}: in_channels must be an int or a pair (source, target), got {channels!r}")
        return _positive(channels[0], "in_channels[0]", layer), _positive(channels[1], "in_channels[1]", layer)
    c = _positive(channels, "in_channels", layer)
    return c, c


def _segment_max(values: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    """Row-wise maximum of ``values`` (``(E, C)``) per ``index``; 0 where a group is empty (as PyG's scatter)."""
    out = values.new_zeros(size, values.shape[1])
    return out.scatter_reduce(0, index[:, None].expand_as(values), values, "amax", include_self=False)


class RGCNConv(nn.Module):
    r"""Relational graph convolution (Schlichtkrull et al.): one member per relation plus the root.

    .. math::
       y_n = x_n\Theta_{\mathrm{root}}
       + \sum_r \frac{1}{|\mathcal N_r(n)|}\sum_{m \in \mathcal N_r(n)} x_m\Theta_r + \beta,

    i.e. the basis of :func:`structconv.structures.graph.relational_basis` with the identity appended.
    ``num_bases`` shares :math:`\Theta_r = \sum_b a_{rb} V_b` (a
    :class:`~structconv.Separable` parameter, contracted without forming :math:`\Theta_r`);
    ``num_blocks`` makes each :math:`\Theta_r` block-diagonal.  Arguments and initialisation as
    PyG's ``RGCNConv``: ``aggr`` ``"mean"`` (default), ``"sum"``/``"add"`` (members weighted 1)
    or ``"max"`` (:math:`\sum_r (\max_{m\in\mathcal N_r(n)} x_m)\Theta_r`, elementwise maximum,
    0 for no neighbour; not linear in :math:`x`, so computed directly, not by the engine).

    ``x`` is node features ``(N, P)``, a node index vector (featureless: row :math:`i` of
    :math:`\Theta_r` is node :math:`i`'s embedding, i.e. one-hot features), ``None`` (all
    ``in_channels`` nodes, featureless), or a bipartite pair ``(x_src, x_dst)`` with
    ``in_channels=(P_src, P_dst)``.
    """

    def __init__(
        self,
        in_channels: int | tuple[int, int],
        out_channels: int,
        num_relations: int,
        num_bases: int | None = None,
        num_blocks: int | None = None,
        aggr: str = "mean",
        root_weight: bool = True,
        bias: bool = True,
    ) -> None:
        super().__init__()
        name = "RGCNConv"
        self.in_channels = in_channels
        P, P_dst = _pair(in_channels, name)
        self.in_channels_l = P
        self.out_channels = _positive(out_channels, "out_channels", name)
        self.num_relations = _positive(num_relations, "num_relations", name)
        if aggr not in ("mean", "sum", "add", "max"):
            raise ValueError(f"RGCNConv: aggr must be 'mean', 'sum', 'add' or 'max', got {aggr!r}")
        self.aggr = aggr
        if num_bases is not None and num_blocks is not None:
            raise ValueError("RGCNConv: give num_bases or num_blocks, not both")
        self.num_bases, self.num_blocks = num_bases, num_blocks
        R, Q = num_relations, out_channels
        self.comp: nn.Parameter | None = None
        if num_bases is not None:
            _positive(num_bases, "num_bases", name)
            self.weight = nn.Parameter(torch.empty(num_bases, P, Q))
            self.comp = nn.Parameter(torch.empty(R, num_bases))
        elif num_blocks is not None:
            _positive(num_blocks, "num_blocks", name)
            if P % num_blocks or Q % num_blocks:
                raise ValueError(f"RGCNConv: in_channels and out_channels must be divisible by num_blocks={num_blocks}")
            self.weight = nn.Parameter(torch.empty(R, num_blocks, P // num_blocks, Q // num_blocks))
        else:
            self.weight = nn.Parameter(torch.empty(R, P, Q))
        self.root = nn.Parameter(torch.empty(P_dst, Q)) if root_weight else None
        self.bias = nn.Parameter(torch.empty(Q)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        glorot_(self.weight)
        if self.comp is not None:
            glorot_(self.comp)
        if self.root is not None:
            glorot_(self.root)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def parameter(self, root: bool = True) -> torch.Tensor | Separable:
        """:math:`\\Theta` over the members (relations, then the root if ``root``), full or separable."""
        R = self.num_relations
        with_root = root and self.root is not None
        if self.comp is not None:
            B = self.comp.shape[1]
            coef = self.comp.T  # (B, R)
            channel: torch.Tensor = self.weight
            if with_root:
                assert self.root is not None
                coef = torch.block_diag(coef, torch.ones(1, 1, dtype=coef.dtype, device=coef.device))  # type: ignore[no-untyped-call]
                channel = torch.cat([channel, self.root[None]])
            return Separable(coef if with_root else coef.reshape(B, R), channel)
        theta = self.relation_weights()
        if with_root:
            assert self.root is not None
            return torch.cat([theta, self.root[None]])
        return theta

    def relation_weights(self) -> torch.Tensor:
        r"""The full :math:`\Theta_r`, ``(R, P, Q)``."""
        if self.comp is not None:
            B = self.comp.shape[1]
            return (self.comp @ self.weight.reshape(B, -1)).reshape(self.num_relations, *self.weight.shape[1:])
        if self.num_blocks is not None:
            return torch.stack([torch.block_diag(*w) for w in self.weight])  # type: ignore[no-untyped-call]
        return self.weight

    def _input(self, x: Any, channels: int, what: str) -> tuple[torch.Tensor, bool]:
        """``(features, featureless)``: float ``(N, channels)``, or a node index vector made one-hot."""
        like = self.weight
        if x is None:
            return torch.eye(channels, dtype=like.dtype, device=like.device), True
        if not isinstance(x, torch.Tensor):
            raise TypeError(f"RGCNConv: {what} must be a tensor or None, got {type(x).__name__}")
        if x.is_floating_point():
            return _features(x, channels, "RGCNConv", static=False), False
        if x.ndim != 1:
            raise ValueError(f"RGCNConv: an integer {what} must be a node index vector (N,), got {tuple(x.shape)}")
        if x.numel() and (int(x.min()) < 0 or int(x.max()) >= channels):
            raise ValueError(f"RGCNConv: node indices in {what} must lie in [0, {channels}), got {x.min()}..{x.max()}")
        return F.one_hot(x.long(), channels).to(dtype=like.dtype), True

    def forward(self, x: Any, edge_index: Any, edge_type: torch.Tensor | None = None) -> torch.Tensor:
        """Apply the layer to ``x`` on ``edge_index`` with one relation (``edge_type``) per edge."""
        name = "RGCNConv"
        P, P_dst = _pair(self.in_channels, name)
        bipartite = isinstance(x, tuple | list)
        if bipartite:
            if len(x) != 2 or x[1] is None:
                raise ValueError("RGCNConv: a bipartite x must be a pair (x_src, x_dst) with x_dst given")
            x_src, x_dst = x
        else:
            x_src, x_dst = x, None
        h_src, featureless = self._input(x_src, P, "x" if not bipartite else "x[0]")
        h_dst, featureless_dst = (h_src, featureless) if x_dst is None else self._input(x_dst, P_dst, "x[1]")
        if self.num_blocks is not None and (featureless or featureless_dst):
            raise ValueError(
                "RGCNConv: num_blocks needs floating node features x; an index vector or x=None (featureless) "
                "is not supported with the block-diagonal decomposition (as in PyG)"
            )
        if edge_type is None:
            raise ValueError("RGCNConv: edge_type is required (one relation per edge of edge_index)")
        if is_matrix_graph(edge_index) or isinstance(edge_index, Basis):
            raise ValueError("RGCNConv: edge_index must be an edge_index (2, E) with an edge_type per edge")
        N_src, N_dst = int(h_src.shape[0]), int(h_dst.shape[0])
        square = x_dst is None
        edges = as_edges(edge_index, N_src, like=h_src, num_targets=None if square else N_dst)
        R, Q = self.num_relations, self.out_channels
        y: torch.Tensor
        if self.aggr == "max":
            etype = torch.as_tensor(edge_type, device=edges.src.device).long()
            if tuple(etype.shape) != (int(edges.src.shape[0]),):
                raise ValueError(f"RGCNConv: edge_type must have shape (E,) = ({int(edges.src.shape[0])},)")
            theta = self.relation_weights()
            y = h_dst.new_zeros(N_dst, Q)
            for r in range(R):
                keep = etype == r
                src, dst = edges.src[keep], edges.dst[keep]
                if featureless:  # PyG takes the maximum of the embeddings Θ_r[m], not of the one-hot rows
                    y = y + _segment_max((h_src @ theta[r]).index_select(0, src), dst, N_dst)
                else:
                    y = y + _segment_max(h_src.index_select(0, src), dst, N_dst) @ theta[r]
            if self.root is not None:
                y = y + h_dst @ self.root
        elif square:
            basis = relational_basis(edges, edge_type, R, root=self.root is not None, aggr=self.aggr)
            y = conv(basis, h_src, self.parameter())
        else:
            basis = relational_basis(edges, edge_type, R, aggr=self.aggr)
            y = conv(basis, h_src, self.parameter(root=False))
            if self.root is not None:
                y = y + h_dst @ self.root
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, num_relations={self.num_relations}, aggr={self.aggr!r}"


FILL_REDUCTIONS = ("mean", "add", "sum", "max", "min")


class GATConv(nn.Module):
    r"""Graph attention (Veličković et al.) as an attention basis with a low-rank :math:`\Theta`.

    Head :math:`h` is the basis member

    .. math:: A_{h,mn} = \mathrm{softmax}_{m \in \mathcal N(n)}
       \mathrm{LeakyReLU}(a_h^{s}\cdot W_h x_m + a_h^{d}\cdot W'_h x_n + a_h^{e}\cdot W^e_h e_{mn}),

    a bi-affine mechanism without its bilinear term, masked by the graph (plus self-loops) and
    normalised column-wise.  The parameter is :math:`\Theta_h = W_h E_h^\top` with :math:`E_h`
    placing head :math:`h`'s :math:`D` channels in the output (``concat``) or averaging heads.
    Because :math:`W_h x` also feeds the scores, it is computed once and the engine contracts
    :math:`\sum_h A_h^\top (xW)\,\Theta'_h` with :math:`\Theta'_h` the head's selector times
    :math:`E_h` (a :class:`~structconv.LowRank` parameter).

    Arguments as PyG's ``GATConv``: ``in_channels`` an int or a bipartite pair ``(P_src, P_dst)``
    (then :math:`W' \ne W`, parameter ``weight_dst``), ``heads``, ``concat``, ``negative_slope``,
    ``dropout`` on the attention weights, ``add_self_loops`` (loops on the first
    :math:`\min(N_{src}, N_{dst})` nodes, existing loops dropped), ``edge_dim`` (edge features
    :math:`e_{mn}` enter the scores through ``weight_edge`` and ``att_edge``), ``fill_value``
    (the added loops' edge features: a number, a tensor, or a reduction of the target's incoming
    features, ``"mean"``, ``"add"``, ``"sum"``, ``"max"`` or ``"min"``), ``bias`` and ``residual``
    (:math:`+\,x_{dst} W^{res}`).  The third argument of :meth:`forward` is PyG's ``edge_attr``;
    it needs ``edge_dim`` (PyG would silently ignore it).
    """

    def __init__(
        self,
        in_channels: int | tuple[int, int],
        out_channels: int,
        heads: int = 1,
        concat: bool = True,
        negative_slope: float = 0.2,
        dropout: float = 0.0,
        add_self_loops: bool = True,
        edge_dim: int | None = None,
        fill_value: float | torch.Tensor | str = "mean",
        bias: bool = True,
        residual: bool = False,
    ) -> None:
        super().__init__()
        name = "GATConv"
        self.in_channels = in_channels
        P, P_dst = _pair(in_channels, name)
        self.out_channels = _positive(out_channels, "out_channels", name)
        self.heads = _positive(heads, "heads", name)
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"GATConv: dropout must lie in [0, 1), got {dropout!r}")
        if isinstance(fill_value, str) and fill_value not in FILL_REDUCTIONS:
            raise ValueError(f"GATConv: fill_value must be a number, a tensor or one of {FILL_REDUCTIONS}")
        self.concat, self.negative_slope, self.dropout = concat, negative_slope, dropout
        self.add_self_loops, self.fill_value, self.residual = add_self_loops, fill_value, residual
        self.edge_dim = None if edge_dim is None else _positive(edge_dim, "edge_dim", name)
        H, D = heads, out_channels
        total = H * D if concat else D
        self.weight = nn.Parameter(torch.empty(P, H * D))
        self.weight_dst = nn.Parameter(torch.empty(P_dst, H * D)) if isinstance(in_channels, tuple | list) else None
        self.att_src = nn.Parameter(torch.empty(H, D))
        self.att_dst = nn.Parameter(torch.empty(H, D))
        self.weight_edge = nn.Parameter(torch.empty(self.edge_dim, H * D)) if self.edge_dim is not None else None
        self.att_edge = nn.Parameter(torch.empty(H, D)) if self.edge_dim is not None else None
        self.res = nn.Parameter(torch.empty(P_dst, total)) if residual else None
        self.bias = nn.Parameter(torch.empty(total)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for w in (self.weight, self.weight_dst, self.weight_edge, self.res):
            if w is not None:
                glorot_(w)
        for a in (self.att_src, self.att_dst, self.att_edge):
            if a is not None:
                glorot_(a[None])
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def _placement(self, like: torch.Tensor) -> LowRank:
        H, D = self.heads, self.out_channels
        eye = torch.eye(D, dtype=like.dtype, device=like.device)
        select = torch.zeros(H, H * D, D, dtype=like.dtype, device=like.device)
        for h in range(H):
            select[h, h * D : (h + 1) * D] = eye
        place = select if self.concat else eye.expand(H, D, D) / H
        return LowRank(select, place)

    def _loop_attr(self, edges: Edges, attr: torch.Tensor, loops: int) -> torch.Tensor:
        """The edge features of the ``loops`` added self-loops, from ``fill_value``."""
        fill = self.fill_value
        C = attr.shape[1]
        if isinstance(fill, str):
            inside = edges.dst < loops  # targets beyond the looped nodes (bipartite) do not count
            dst, attr = edges.dst[inside], attr[inside]
            index = dst[:, None].expand(-1, C)
            if fill in ("add", "sum", "mean"):
                total = attr.new_zeros(loops, C).index_add(0, dst, attr)
                if fill != "mean":
                    return total
                count = attr.new_zeros(loops).index_add(0, dst, attr.new_ones(dst.shape[0]))
                return total / count.clamp(min=1)[:, None]
            reduce = "amax" if fill == "max" else "amin"
            return attr.new_zeros(loops, C).scatter_reduce(0, index, attr, reduce, include_self=False)
        value = torch.as_tensor(fill, dtype=attr.dtype, device=attr.device)
        return value.expand(loops, C) if value.ndim <= 1 else value

    def _graph(
        self, edge_index: Any, N_src: int, N_dst: int, edge_attr: torch.Tensor | None, like: torch.Tensor
    ) -> tuple[Edges, torch.Tensor | None]:
        """The attention pattern (with PyG's self-loops) and its edge features ``(E, edge_dim)``."""
        matrix = is_matrix_graph(edge_index)
        if matrix and edge_attr is not None:
            raise ValueError("GATConv: edge_attr goes with an edge_index, not with a sparse adjacency")
        edges = as_edges(edge_index, N_src, like=like, adj_t=True, num_targets=N_dst)
        attr = None
        if edge_attr is not None:
            E = int(edges.src.shape[0])
            attr = edge_attr.reshape(-1, 1) if edge_attr.ndim == 1 else edge_attr
            if attr.ndim != 2 or int(attr.shape[0]) != E or int(attr.shape[1]) != self.edge_dim:
                raise ValueError(
                    f"GATConv: edge_attr must have shape (E, edge_dim) = ({E}, {self.edge_dim}), got "
                    f"{tuple(edge_attr.shape)}"
                )
            attr = attr.to(like.dtype)
        if self.add_self_loops:
            keep = edges.src != edges.dst
            edges = edges.with_edges(edges.src[keep], edges.dst[keep], edges.weight[keep])
            loops = min(N_src, N_dst)
            nodes = torch.arange(loops, device=edges.src.device)
            if attr is not None:
                attr = attr[keep]
                attr = torch.cat([attr, self._loop_attr(edges, attr, loops).to(attr.dtype)])
            edges = edges.with_edges(
                torch.cat([edges.src, nodes]),
                torch.cat([edges.dst, nodes]),
                torch.cat([edges.weight, edges.weight.new_ones(loops)]),
            )
        return edges, attr

    def attention(
        self,
        x: torch.Tensor | tuple[torch.Tensor, torch.Tensor | None],
        edge_index: Any,
        edge_attr: torch.Tensor | None = None,
        size: tuple[int, int] | None = None,
    ) -> tuple[EdgeBasis, torch.Tensor]:
        """The attention basis (``H`` members, ``(N_src, N_dst)``) and the projected sources :math:`xW`."""
        basis, h, _ = self._attention(x, edge_index, edge_attr, size)
        return basis, h

    def _attention(
        self,
        x: torch.Tensor | tuple[torch.Tensor, torch.Tensor | None],
        edge_index: Any,
        edge_attr: torch.Tensor | None,
        size: tuple[int, int] | None,
    ) -> tuple[EdgeBasis, torch.Tensor, torch.Tensor | None]:
        name = "GATConv"
        P, P_dst = _pair(self.in_channels, name)
        if isinstance(x, tuple | list):
            if len(x) != 2:
                raise ValueError("GATConv: a bipartite x must be a pair (x_src, x_dst)")
            x_src = _features(x[0], P, name, static=False)
            x_dst = None if x[1] is None else _features(x[1], P_dst, name, static=False)
        else:
            x_src = x_dst = _features(x, P, name, static=False)
        if edge_attr is not None and self.edge_dim is None:
            raise ValueError(
                "GATConv: edge_attr (the third argument) needs edge_dim; PyG's GATConv would ignore it. "
                "Construct the layer with edge_dim to use edge features"
            )
        if isinstance(edge_index, Basis):
            raise ValueError("GATConv: edge_index must be a graph (edge_index or sparse adjacency), not a basis")
        N_src = int(x_src.shape[0])
        if is_matrix_graph(edge_index):
            rows, cols = int(edge_index.shape[0]), int(edge_index.shape[1])  # adj_t: (N_dst, N_src)
            if cols != N_src:
                raise ValueError(f"GATConv: the sparse adjacency (adj_t) has {cols} columns but x has {N_src} nodes")
            N_dst = rows
        elif size is not None:
            if int(size[0]) != N_src:
                raise ValueError(f"GATConv: size[0]={size[0]} but x (the sources) has {N_src} nodes")
            N_dst = int(size[1])
        else:
            N_dst = N_src if x_dst is None else int(x_dst.shape[0])
        if x_dst is not None and int(x_dst.shape[0]) != N_dst:
            raise ValueError(f"GATConv: x_dst has {int(x_dst.shape[0])} nodes but the graph has {N_dst} targets")
        H, D = self.heads, self.out_channels
        h = x_src @ self.weight
        score_src = (h.view(N_src, H, D) * self.att_src).sum(-1)
        score_dst = None
        if x_dst is not None:
            h_dst = h if x_dst is x_src else x_dst @ (self.weight if self.weight_dst is None else self.weight_dst)
            score_dst = (h_dst.view(N_dst, H, D) * self.att_dst).sum(-1)
        if N_src == 0 or N_dst == 0:
            _check_empty(edge_index, name)
            empty = torch.zeros(0, dtype=torch.long, device=x_src.device)
            return EdgeBasis(empty, empty, h.new_zeros(0, H), (N_src, N_dst)), h, x_dst
        edges, attr = self._graph(edge_index, N_src, N_dst, edge_attr, h)
        # index_select, not fancy indexing: its backward is a scatter-add rather than an index_put.
        logits = score_src.index_select(0, edges.src)
        if score_dst is not None:
            logits = logits + score_dst.index_select(0, edges.dst)
        if attr is not None and self.weight_edge is not None and self.att_edge is not None and len(logits):
            logits = logits + ((attr @ self.weight_edge).view(-1, H, D) * self.att_edge).sum(-1)
        alpha = _segment_softmax(F.leaky_relu(logits, self.negative_slope), edges.dst, N_dst)
        alpha = F.dropout(alpha, self.dropout, self.training)
        return EdgeBasis(edges.src, edges.dst, alpha, (N_src, N_dst)), h, x_dst

    def forward(
        self,
        x: torch.Tensor | tuple[torch.Tensor, torch.Tensor | None],
        edge_index: Any,
        edge_attr: torch.Tensor | None = None,
        size: tuple[int, int] | None = None,
        return_attention_weights: bool | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, Any]:
        """Apply the layer to ``x`` (``(N, P)`` or ``(x_src, x_dst)``) on ``edge_index``.

        This is the engine's x·Θ-first order for :math:`\\Theta_h = W_h E_h^\top`, run step by
        step because its first step, :math:`xW`, is already computed for the attention scores:
        the layer applies the basis to it with the basis' own hook
        (:meth:`~structconv.Basis.apply_members`, unreduced) and then places the heads
        (:math:`E_h`).  :func:`structconv.conv` with ``LowRank(W, E)`` gives the same result (a
        test checks it) but would compute :math:`xW` twice.

        With ``return_attention_weights=True`` it returns ``(out, (edge_index, alpha))`` as PyG
        does: the edges with the added self-loops and their ``(E, H)`` weights, or for a sparse
        adjacency ``(out, (adj_t, alpha))`` with ``adj_t`` a sparse ``(N_dst, N_src, H)`` tensor.
        """
        basis, h, x_dst = self._attention(x, edge_index, edge_attr, size)
        N_src, N_dst = basis.M, basis.N
        H, D = self.heads, self.out_channels
        heads = basis.apply_members(h.view(1, N_src, H, D).permute(0, 2, 1, 3), reduce=False)[0]  # (H, N_dst, D)
        y: torch.Tensor = heads.permute(1, 0, 2).reshape(N_dst, H * D) if self.concat else heads.mean(0)
        if self.res is not None and x_dst is not None:
            y = y + x_dst @ self.res
        if self.bias is not None:
            y = y + self.bias
        if not return_attention_weights:
            return y
        src, dst, alpha = basis.src, basis.dst, basis.weights
        if is_matrix_graph(edge_index):
            adj = torch.sparse_coo_tensor(torch.stack([dst, src]), alpha, (N_dst, N_src, H))
            return y, (adj, alpha)
        return y, (torch.stack([src, dst]), alpha)

    def value_and_placement(self) -> LowRank:
        """:math:`\\Theta_h = W_h E_h^\top` as a :class:`~structconv.LowRank` parameter, for :func:`structconv.conv`."""
        H, D = self.heads, self.out_channels
        value = self.weight.view(self.weight.shape[0], H, D).permute(1, 0, 2)
        return LowRank(value, self._placement(self.weight).out)

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, heads={self.heads}"


def _segment_softmax(logits: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    """Softmax of ``logits`` (``(E, H)``) over the entries that share ``index`` (their target)."""
    H = logits.shape[1]
    expanded = index[:, None].expand(-1, H)
    # The shift by each group's maximum cancels in the ratio; detached, it costs no backward pass.
    peak = logits.new_full((size, H), -torch.inf).scatter_reduce(0, expanded, logits.detach(), "amax")
    exp = (logits - peak.index_select(0, index)).exp()
    total = logits.new_zeros(size, H).index_add(0, index, exp)
    return exp / total.index_select(0, index)
