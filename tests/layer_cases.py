"""The catalogue of cases of every layer of ``structconv.nn``, shared by the layer contract and the device tests.

Each entry of :data:`CASES` builds a layer (in torch's default dtype: the caller casts it) and
makes its inputs (float64, drawn from torch's global generator, so a seed fixes them); the name
before ``"["`` is the class in ``structconv.nn``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

import structconv as sc
from structconv import nn as snn

D64 = torch.float64
_EDGE_INDEX = torch.tensor([[0, 1, 2, 3, 4, 5, 1, 3], [1, 2, 3, 4, 0, 2, 5, 0]])
_EDGE_TYPE = torch.tensor([0, 1, 0, 1, 0, 1, 1, 0])

Inputs = tuple[Any, ...]


class MeanSAGE(snn.GraphLayer):
    """A user's own layer on :class:`~structconv.nn.GraphLayer`: GraphSAGE-mean (module level, so it pickles)."""

    def __init__(self, in_channels: int, out_channels: int) -> None:
        super().__init__(in_channels, out_channels, members=2)

    def graph_basis(self, edges: Any) -> sc.Basis:
        return sc.graph_basis(edges, ("mean", "identity"))


class Causal(snn.GridLayer):
    """A user's own grid layer on :class:`~structconv.nn.GridLayer`: a dilated causal 1-D convolution."""

    def __init__(self, in_channels: int, out_channels: int, dilation: int = 2) -> None:
        super().__init__(in_channels, out_channels, members=2, dims=1)
        self.dilation = dilation

    def grid_basis(self, grid: tuple[int, ...], like: torch.Tensor) -> sc.Basis:
        return sc.grid_basis(grid, 2, dilation=self.dilation, padding=((self.dilation, 0),), like=like)


def _graph() -> Inputs:
    return (torch.randn(6, 3, dtype=D64), _EDGE_INDEX)


def _tokens() -> Inputs:
    x = torch.randn(2, 5, 4, dtype=D64)
    return (x, x, x)


def _fixed_basis() -> sc.Basis:
    generator = torch.Generator().manual_seed(3)
    dense = torch.randn(2, 6, 6, generator=generator, dtype=D64)
    return sc.SparseBasis.from_dense(dense * (torch.rand(2, 6, 6, generator=generator) < 0.5))


#: name -> (build the layer, make its inputs); the name before "[" is the class in ``structconv.nn``.
CASES: dict[str, tuple[Callable[[], nn.Module], Callable[[], Inputs]]] = {
    "AvgPool1d": (lambda: snn.AvgPool1d(2), lambda: (torch.randn(2, 3, 8, dtype=D64),)),
    "AvgPool2d": (lambda: snn.AvgPool2d(3, stride=2, padding=1), lambda: (torch.randn(2, 3, 7, 6, dtype=D64),)),
    "AvgPool3d": (lambda: snn.AvgPool3d(2), lambda: (torch.randn(1, 2, 4, 4, 4, dtype=D64),)),
    "GridConv1d": (lambda: snn.GridConv1d(3, 4, 3, padding=1), lambda: (torch.randn(2, 3, 8, dtype=D64),)),
    "GridConv2d": (lambda: snn.GridConv2d(3, 4, 3, padding=1), lambda: (torch.randn(2, 3, 6, 5, dtype=D64),)),
    "GridConv2d[groups]": (
        lambda: snn.GridConv2d(4, 6, 3, stride=2, groups=2, padding_mode="circular", padding=1),
        lambda: (torch.randn(2, 4, 6, 6, dtype=D64),),
    ),
    "GridConv3d": (lambda: snn.GridConv3d(2, 3, 3, padding=1), lambda: (torch.randn(1, 2, 4, 4, 4, dtype=D64),)),
    "GridLayer": (lambda: Causal(3, 4), lambda: (torch.randn(2, 3, 8, dtype=D64),)),
    "ChebConv": (lambda: snn.ChebConv(3, 4, K=3), _graph),
    "GATConv": (lambda: snn.GATConv(3, 2, heads=2), _graph),
    "GATConv[mean]": (lambda: snn.GATConv(3, 2, heads=3, concat=False), _graph),
    "GCNConv": (lambda: snn.GCNConv(3, 4), _graph),
    "SGConv": (lambda: snn.SGConv(3, 4, K=2), _graph),
    "SAGEConv": (lambda: snn.SAGEConv(3, 4), _graph),
    "SAGEConv[project]": (lambda: snn.SAGEConv(3, 4, aggr="sum", project=True, normalize=True), _graph),
    "GINConv": (
        lambda: snn.GINConv(nn.Sequential(nn.Linear(3, 5), nn.ReLU(), nn.Linear(5, 4)), train_eps=True),
        _graph,
    ),
    "GraphLayer": (lambda: MeanSAGE(3, 4), _graph),
    "TAGConv": (lambda: snn.TAGConv(3, 4, K=2), _graph),
    "RGCNConv": (lambda: snn.RGCNConv(3, 4, num_relations=2), lambda: (*_graph(), _EDGE_TYPE)),
    "RGCNConv[bases]": (
        lambda: snn.RGCNConv(3, 4, num_relations=2, num_bases=2),
        lambda: (*_graph(), _EDGE_TYPE),
    ),
    "MultiHeadSelfAttention": (lambda: snn.MultiHeadSelfAttention(4, 2, batch_first=True), _tokens),
    "MultiHeadSelfAttention[cross]": (
        lambda: snn.MultiHeadSelfAttention(4, 2, batch_first=True, kdim=3, vdim=5),
        lambda: (torch.randn(2, 4, 4, dtype=D64), torch.randn(2, 6, 3, dtype=D64), torch.randn(2, 6, 5, dtype=D64)),
    ),
    "PositionalAttention": (
        lambda: snn.PositionalAttention((3, 3), 4, 2),
        lambda: (torch.randn(2, 3, 3, 4, dtype=D64),),
    ),
    "PositionalAttention[content]": (
        lambda: snn.PositionalAttention((3, 3), 4, 2, content=snn.ContentHeads(), head_dim=2),
        lambda: (torch.randn(2, 9, 4, dtype=D64),),
    ),
    "PositionalAttention[gaussian]": (
        lambda: snn.PositionalAttention((3, 3), 4, 2, encoding=snn.GaussianHeads()),
        lambda: (torch.randn(2, 3, 3, 4, dtype=D64),),
    ),
    "PositionalAttention[learned]": (
        lambda: snn.PositionalAttention((3, 3), 4, 2, encoding=snn.LearnedHeads(), content=snn.ContentHeads(bias=True)),
        lambda: (torch.randn(2, 9, 4, dtype=D64),),
    ),
    "StructConv": (lambda: snn.StructConv(_fixed_basis(), 3, 4), lambda: (torch.randn(2, 6, 3, dtype=D64),)),
}
