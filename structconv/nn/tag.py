"""TAG: the powers of the normalised adjacency, one member each."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from ..bases.base import Basis
from ..structures.graph import PolynomialBasis, gcn_normalize
from .graph_common import _GraphLayer, _positive, _read


class TAGConv(_GraphLayer):
    r"""Topology-adaptive graph convolution (Du et al.): :math:`y = \sum_{k=0}^{K} (S^k)^\top x\,\Theta_k + \beta`.

    :math:`S = D^{-1/2}AD^{-1/2}` without added loops; the basis is a
    :class:`~structconv.PolynomialBasis` applied by repeated sparse products.  Weights as
    ``torch.nn.Linear`` (as PyG's ``TAGConv``), zero bias; ``x`` may be ``(B, N, P)``.
    ``load_state_dict`` also reads PyG's ``lins.k.weight`` (transposed into ``theta[k]``) and
    ``bias``; :func:`structconv.nn.pyg_state.pyg_state_dict` gives them back.
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
