"""Torch layers, each a basis plus a parameter over :func:`structconv.conv`."""

from .attention import MultiHeadSelfAttention
from .graph import ChebConv, GATConv, GCNConv, RGCNConv, SGConv, TAGConv
from .grid import AvgPool1d, AvgPool2d, AvgPool3d, GridConv1d, GridConv2d, GridConv3d
from .positional import PositionalAttention
from .structconv import StructConv

__all__ = [
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "ChebConv",
    "GATConv",
    "GCNConv",
    "GridConv1d",
    "GridConv2d",
    "GridConv3d",
    "MultiHeadSelfAttention",
    "PositionalAttention",
    "RGCNConv",
    "SGConv",
    "StructConv",
    "TAGConv",
]
