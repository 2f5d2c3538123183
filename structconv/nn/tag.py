"""TAG: the powers of the normalised adjacency, one member each."""

from __future__ import annotations

from typing import Any

import torch

from ..backend.checks import positive_int
from ..bases.base import Basis
from ..structures.graph import PolynomialBasis, gcn_normalize
from .graph_common import _GraphLayer, _read


class TAGConv(_GraphLayer):
    r"""Topology-adaptive graph convolution (Du et al.): one member per power of the normalised adjacency.

    Basis: the powers :math:`S^0 = I, S^1, \dots, S^K` of :math:`S = D^{-1/2}AD^{-1/2}`, a
    :class:`~structconv.PolynomialBasis` (K = ``K + 1``)

    Θ: ``weight``, one channel map per power, a tensor as :meth:`theta` returns it (K, P, Q)

    .. math:: y = \sum_{k=0}^{K} (S^k)^\top x\,\Theta_k + \beta,
              \qquad S = D^{-1/2} A D^{-1/2} \ \text{(no added loops)}.

    A drop-in for PyG's ``TAGConv``, derived and compared in ``docs/graph.rst``.

    Parameters
    ----------
    in_channels : int
        :math:`P`, the width of the node features.
    out_channels : int
        :math:`Q`, the width of the output.
    K : int, default 3
        The largest power (hops); the basis has :math:`K + 1` members.
    bias : bool, default True
        Whether to add a learnable bias :math:`\beta` of shape ``(Q,)``.
    normalize : bool, default True
        Use :math:`S = D^{-1/2}AD^{-1/2}`; ``False`` takes the raw (weighted) adjacency.
    flow : {"source_to_target", "target_to_source"}, default "source_to_target"
        The direction of an ``edge_index``'s edges, as PyG's ``flow``; keyword-only.

    Shapes
    ------
    - **input:** ``x`` :math:`(N, P)` or :math:`(B, N, P)`; ``edge_index`` :math:`(2, E)`, a
      sparse ``adj_t`` :math:`(N, N)` or a :class:`~structconv.Basis`; ``edge_weight`` :math:`(E,)`
    - **output:** :math:`(N, Q)` or :math:`(B, N, Q)`

    Examples
    --------
    >>> import torch
    >>> from structconv.nn import TAGConv
    >>> x, layer = torch.randn(4, 3), TAGConv(3, 2, K=2)
    >>> edge_index = torch.tensor([[0, 1, 1, 2, 2, 3], [1, 0, 2, 1, 3, 2]])
    >>> A = torch.zeros(4, 4)
    >>> A[edge_index[0], edge_index[1]] = 1.0
    >>> d = A.sum(0).rsqrt()
    >>> S, t = d[:, None] * A * d, layer.weight
    >>> y = x @ t[0] + S.T @ x @ t[1] + (S @ S).T @ x @ t[2] + layer.bias
    >>> torch.allclose(layer(x, edge_index), y, atol=1e-6)
    True
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        K: int = 3,
        bias: bool = True,
        normalize: bool = True,
        *,
        flow: str = "source_to_target",
    ) -> None:
        self.K = positive_int(K, "K", where="TAGConv")
        super().__init__(in_channels, out_channels, self.K + 1, bias=bias, flow=flow)
        self.normalize = normalize
        self.draw_as_built()
        self.reset_parameters()

    pyg_initializer = "kaiming"  # PyG's lins are Linear(in, out) with its default initialiser

    def _basis(self, x: torch.Tensor, graph: Any, edge_weight: torch.Tensor | None) -> Basis:
        edges = _read(graph, x, edge_weight, "TAGConv")
        if self.normalize:
            edges = gcn_normalize(edges, add_self_loops=False)
        return PolynomialBasis(edges.to_basis(), range(self.K + 1), "powers")
