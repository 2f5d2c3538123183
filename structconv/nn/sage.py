r"""GraphSAGE: the mean of the in-neighbours and the node's own features, one channel map each."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.nn import functional as F  # noqa: N812

from ..bases.base import Basis
from ..structures.graph import Edges, graph_basis
from .graph_common import GraphLayer, _pair, pyg_linear_draw_
from .pyg_state import PyGKey, member_keys, same_key

#: PyG's names of the aggregations SAGEConv contracts, and the member each gives.
AGGREGATIONS = {"mean": "mean", "sum": "adjacency", "add": "adjacency"}


class SAGEConv(GraphLayer):
    r"""GraphSAGE (Hamilton et al.): each node's in-neighbours averaged, and its own features.

    Basis: :math:`[D_{\mathrm{in}}^{-1}A, I]` (``graph_basis(edges, ("mean", "identity"))``;
    :math:`A` for ``aggr="sum"``; without :math:`I` when ``root_weight=False``)

    Θ: ``weight`` (K, P, Q): member 0 is PyG's ``lin_l.weight`` transposed, member 1 ``lin_r``'s

    .. math:: y_n = \frac{1}{|\mathcal N(n)|}\sum_{m \to n} x_m\,\Theta_0 + x_n\,\Theta_1 + \beta,
              \qquad y_n \leftarrow y_n / \lVert y_n \rVert_2 \ \text{if normalize}.

    A drop-in for PyG's ``SAGEConv``: its arguments, ``state_dict`` (``lin_l.weight``,
    ``lin_l.bias``, ``lin_r.weight``, ``lin.*`` with ``project``), initial draws and call,
    bipartite pairs ``(x_src, x_dst)`` included.

    Parameters
    ----------
    in_channels : int or tuple of int
        :math:`P`, or ``(P_src, P_dst)`` for a bipartite graph (equal widths).
    out_channels : int
        :math:`Q`.
    aggr : {"mean", "sum", "add"}, default "mean"
        The neighbours' mean (PyG's default) or sum.
    normalize : bool, default False
        Scale each output row to unit L2 norm.
    root_weight : bool, default True
        Add the node's own features through :math:`\Theta_1`.
    project : bool, default False
        Map the sources first through ``lin`` (``(P, P)`` with bias) and a ReLU, as PyG does.
    bias : bool, default True
        A learnable :math:`\beta` (PyG's ``lin_l.bias``).
    flow : {"source_to_target", "target_to_source"}, default "source_to_target"
        The direction of an ``edge_index``'s edges, as PyG's ``flow``; keyword-only.

    Shapes
    ------
    - **input:** ``x`` :math:`(N, P)` or a pair :math:`((N_{src}, P), (N_{dst}, P))`;
      ``edge_index`` :math:`(2, E)` or a sparse ``adj_t``; ``size`` :math:`(N_{src}, N_{dst})`
    - **output:** :math:`(N, Q)` (:math:`(N_{dst}, Q)` for a pair)

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import SAGEConv
    >>> layer, x = SAGEConv(3, 2), torch.randn(4, 3)
    >>> edge_index = torch.tensor([[0, 1, 2, 2], [1, 2, 1, 3]])
    >>> A = torch.zeros(4, 4)
    >>> A[edge_index[0], edge_index[1]] = 1.0
    >>> mean = A / A.sum(0).clamp(min=1)  # column n: the mean over n's in-neighbours
    >>> y = mean.T @ x @ layer.weight[0] + x @ layer.weight[1] + layer.bias
    >>> torch.allclose(layer(x, edge_index), y, atol=1e-6)
    True
    """

    def __init__(
        self,
        in_channels: int | tuple[int, int],
        out_channels: int,
        aggr: str = "mean",
        normalize: bool = False,
        root_weight: bool = True,
        project: bool = False,
        bias: bool = True,
        *,
        flow: str = "source_to_target",
    ) -> None:
        source, target = _pair(in_channels, "SAGEConv")
        if source != target and root_weight:
            raise ValueError(
                f"SAGEConv: in_channels={in_channels!r}: a pair of different widths is not supported (the sources' "
                "and targets' features are stacked into one input); pass equal widths"
            )
        if not isinstance(aggr, str) or aggr not in AGGREGATIONS:
            raise ValueError(
                f"SAGEConv: aggr must be one of {tuple(AGGREGATIONS)} (a linear aggregation, a basis), got {aggr!r}"
            )
        self.aggr, self.normalize, self.root_weight, self.project = aggr, bool(normalize), bool(root_weight), project
        super().__init__(source, out_channels, 2 if root_weight else 1, bias=bias, flow=flow)
        self.in_channels_pair = in_channels
        self.lin = nn.Linear(source, source) if project else None
        self.reset_parameters()  # PyG draws at construction and again in reset_parameters

    def reset_parameters(self) -> None:
        """Draw as PyG's ``SAGEConv.reset_parameters``: ``lin`` (with ``project``), ``lin_l``, then ``lin_r``."""
        if getattr(self, "lin", None) is not None:
            self.lin.reset_parameters()  # type: ignore[union-attr]
        pyg_linear_draw_(self.weight.data[0], "kaiming", self.bias)
        if self.root_weight:
            pyg_linear_draw_(self.weight.data[1], "kaiming")

    def pyg_keys(self) -> list[PyGKey]:
        """``weight``'s members: PyG's ``lin_l.weight`` and ``lin_r.weight`` transposed; ``bias``: ``lin_l.bias``."""
        names = ["lin_l.weight", "lin_r.weight"][: int(self.weight.shape[0])]
        return [member_keys("weight", names)] + ([same_key("bias", "lin_l.bias")] if self.bias is not None else [])

    def graph_basis(self, edges: Edges) -> Basis:
        members = (AGGREGATIONS[self.aggr], "identity") if self.root_weight else (AGGREGATIONS[self.aggr],)
        return graph_basis(edges, members)

    def forward(self, x: Any, edge_index: Any, size: Any = None) -> torch.Tensor:  # type: ignore[override]
        """Apply the layer to ``x`` (or a pair ``(x_src, x_dst)``) on ``edge_index``."""
        if self.lin is not None:
            pair = isinstance(x, tuple | list)
            x_src = F.relu(self.lin(x[0] if pair else x))
            x = (x_src, x[1]) if pair else (x_src, x)
            if not pair and size is None:
                size = (int(x_src.shape[0]), int(x_src.shape[0]))
        y = self._run(x, edge_index, None, size=size)
        return F.normalize(y, p=2.0, dim=-1) if self.normalize else y

    def extra_repr(self) -> str:
        return f"{self.in_channels_pair}, {self.out_channels}, aggr={self.aggr!r}"
