"""Relational graph convolution: one member per relation, plus the root."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from ..backend.checks import positive_int
from ..backend.torch_autocast import check_input_dtype
from ..bases.base import Basis
from ..bases.factor import Separable
from ..structures.graph import Edges, as_edges, is_matrix_graph, relational_basis
from ._module import CompiledRuns, NotScriptable, check_parameter_memory, warn_jit_trace
from .graph_common import _features, _pair, glorot_


def _segment_max(values: torch.Tensor, index: torch.Tensor, size: int) -> torch.Tensor:
    """Row-wise maximum of ``values`` (``(E, C)``) per ``index``; 0 where a group is empty (as PyG's scatter)."""
    out = values.new_zeros(size, values.shape[1])
    return out.scatter_reduce(0, index[:, None].expand_as(values), values, "amax", include_self=False)


class RGCNConv(CompiledRuns, NotScriptable, nn.Module):
    r"""Relational graph convolution (Schlichtkrull et al.): one member per relation, plus the root.

    Basis: the mean (or sum) adjacency of each relation, then :math:`I` for the root, by
    :func:`structconv.structures.graph.relational_basis` (K = ``num_relations + 1``)

    Θ: :math:`\Theta_r` per relation, then ``root``: a tensor, or a :class:`~structconv.Separable` with ``num_bases``,
    as :meth:`theta` returns it (K, P, Q)

    .. math:: y_n = x_n\Theta_{\mathrm{root}}
              + \sum_r \frac{1}{|\mathcal N_r(n)|}\sum_{m \in \mathcal N_r(n)} x_m\Theta_r + \beta.

    A drop-in for PyG's ``RGCNConv`` (its parameters' names and shapes too), derived and compared
    in ``docs/graph.rst``.

    Parameters
    ----------
    in_channels : int or tuple of int
        :math:`P`; a pair ``(P_src, P_dst)`` for a bipartite graph (the root maps the targets);
        the number of nodes for a featureless ``x`` (an index vector or ``None``).
    out_channels : int
        :math:`Q`, the width of the output.
    num_relations : int
        :math:`R`, the number of edge types.
    num_bases : int, optional
        Share the relations' maps as combinations of this many (:math:`\Theta_r = \sum_b a_{rb} V_b`).
    num_blocks : int, optional
        Make each relation's map block-diagonal with this many blocks (not with ``num_bases``).
    aggr : {"mean", "sum", "add", "max"}, default "mean"
        Each relation's aggregation (``"sum"``, ``"add"``: weights 1; ``"max"``: not linear, no :meth:`basis`).
    root_weight : bool, default True
        Whether to add the root term :math:`x_n\Theta_{\mathrm{root}}` (the identity member).
    is_sorted : bool, default False
        PyG's promise that the edges are sorted by ``edge_type``; kept, the result ignores it.
    bias : bool, default True
        Whether to add a learnable bias :math:`\beta` of shape ``(Q,)``.

    Shapes
    ------
    - **input:** ``x`` :math:`(N, P)`, indices :math:`(N,)` or ``None`` (featureless), or a pair
      :math:`((N_s, P_s), (N_t, P_t))`; ``edge_index`` :math:`(2, E)`; ``edge_type`` :math:`(E,)`
    - **output:** :math:`(N_t, Q)`

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import RGCNConv
    >>> x, layer = torch.randn(4, 3), RGCNConv(3, 2, num_relations=2)
    >>> edge_index = torch.tensor([[0, 1, 2, 3], [1, 2, 3, 0]])  # a cycle
    >>> edge_type = torch.tensor([0, 1, 0, 1])
    >>> A = torch.zeros(2, 4, 4)  # one neighbour each: the mean is that neighbour
    >>> A[edge_type, edge_index[0], edge_index[1]] = 1.0
    >>> y = x @ layer.root + torch.einsum("rmn,mp,rpq->nq", A, x, layer.weight) + layer.bias
    >>> torch.allclose(layer(x, edge_index, edge_type), y, atol=1e-6)
    True
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
        is_sorted: bool = False,
        bias: bool = True,
    ) -> None:
        super().__init__()
        name = "RGCNConv"
        self.in_channels = in_channels
        P, P_dst = _pair(in_channels, name)
        self.in_channels_l = P
        self.out_channels = positive_int(out_channels, "out_channels", where=name)
        self.num_relations = positive_int(num_relations, "num_relations", where=name)
        if aggr not in ("mean", "sum", "add", "max"):
            raise ValueError(f"RGCNConv: aggr must be 'mean', 'sum', 'add' or 'max', got {aggr!r}")
        self.aggr = aggr
        self.is_sorted = bool(is_sorted)
        if num_bases is not None and num_blocks is not None:
            raise ValueError("RGCNConv: give num_bases or num_blocks, not both")
        if num_bases is not None:
            num_bases = positive_int(num_bases, "num_bases", where=name)
        if num_blocks is not None:
            num_blocks = positive_int(num_blocks, "num_blocks", where=name)
        self.num_bases, self.num_blocks = num_bases, num_blocks
        R, Q = self.num_relations, self.out_channels
        members = num_bases if num_bases is not None else R
        sizes = f"num_relations={R}, in_channels={in_channels}, out_channels={Q}"
        check_parameter_memory(name, members * P * Q + (R * members if num_bases else 0), sizes)
        self.comp: nn.Parameter | None = None
        if num_bases is not None:
            self.weight = nn.Parameter(torch.empty(num_bases, P, Q))
            self.comp = nn.Parameter(torch.empty(R, num_bases))
        elif num_blocks is not None:
            if P % num_blocks or Q % num_blocks:
                raise ValueError(f"RGCNConv: in_channels and out_channels must be divisible by num_blocks={num_blocks}")
            self.weight = nn.Parameter(torch.empty(R, num_blocks, P // num_blocks, Q // num_blocks))
        else:
            self.weight = nn.Parameter(torch.empty(R, P, Q))
        self.root = nn.Parameter(torch.empty(P_dst, Q)) if root_weight else None
        self.bias = nn.Parameter(torch.empty(Q)) if bias else None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for w in (self.weight, self.comp, self.root):
            if w is not None:
                glorot_(w)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def theta(self, *, root: bool = True) -> torch.Tensor | Separable:
        """:math:`\\Theta` over the members (relations, then the root if ``root``), full or separable."""
        with_root = root and self.root is not None
        if self.comp is not None:
            coef = self.comp.T  # (B, R)
            channel: torch.Tensor = self.weight
            if with_root:
                assert self.root is not None
                coef = torch.block_diag(coef, torch.ones(1, 1, dtype=coef.dtype, device=coef.device))  # type: ignore[no-untyped-call]
                channel = torch.cat([channel, self.root[None]])
            return Separable(coef, channel)
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
            features = _features(x, channels, "RGCNConv", static=False)
            check_input_dtype(features, like, "RGCNConv", what)
            return features, False
        if x.ndim != 1:
            raise ValueError(f"RGCNConv: an integer {what} must be a node index vector (N,), got {tuple(x.shape)}")
        if x.numel() and (int(x.min()) < 0 or int(x.max()) >= channels):
            raise ValueError(f"RGCNConv: node indices in {what} must lie in [0, {channels}), got {x.min()}..{x.max()}")
        return F.one_hot(x.long(), channels).to(dtype=like.dtype), True

    def _read(
        self, x: Any, edge_index: Any, edge_type: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, bool, bool, Edges]:
        """``(h_src, h_dst, featureless, square, edges)``: ``forward``'s arguments checked and read."""
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
        return h_src, h_dst, featureless, square, edges

    def basis(self, x: Any, edge_index: Any, edge_type: torch.Tensor | None = None) -> Basis:
        """The relational basis (one member per relation, then the root's identity) on ``edge_index``.

        Arguments as :meth:`forward`.  For a square graph the layer's output is
        ``conv(basis, h, theta())`` plus the bias, with ``h`` the node features (one-hot for a
        featureless ``x``); for a bipartite ``x`` the basis has no root member, and the output is
        ``conv(basis, h_src, theta(root=False)) + x_dst @ root`` plus the bias.  ``aggr="max"``
        is not linear in ``x`` and has no basis.
        """
        if self.aggr == "max":
            raise ValueError("RGCNConv: aggr='max' is not linear in x, so it has no basis; use 'mean', 'sum' or 'add'")
        _, _, _, square, edges = self._read(x, edge_index, edge_type)
        return self._relational(edges, edge_type, square)

    def _relational(self, edges: Edges, edge_type: Any, square: bool) -> Basis:
        """The members of :meth:`basis`: the root's identity last only for a square graph."""
        return relational_basis(
            edges, edge_type, self.num_relations, root=square and self.root is not None, aggr=self.aggr
        )

    def forward(self, x: Any, edge_index: Any, edge_type: torch.Tensor | None = None) -> torch.Tensor:
        """Apply the layer to ``x`` on ``edge_index`` with one relation (``edge_type``) per edge."""
        warn_jit_trace(self)
        h_src, h_dst, featureless, square, edges = self._read(x, edge_index, edge_type)
        N_dst = int(h_dst.shape[0])
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
        else:
            y = self.contract(self._relational(edges, edge_type, square), h_src, self.theta(root=square))
            if not square and self.root is not None:
                y = y + h_dst @ self.root
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        return f"{self.in_channels}, {self.out_channels}, num_relations={self.num_relations}, aggr={self.aggr!r}"
