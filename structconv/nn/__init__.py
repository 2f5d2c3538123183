"""Torch layers, each a basis plus a parameter over :func:`structconv.conv`."""

from .attention import MultiHeadSelfAttention, QuadraticPositionalAttention
from .graph import ChebConv, GATConv, GCNConv, RGCNConv, SGConv, TAGConv
from .grid import AvgPool1d, AvgPool2d, AvgPool3d, GridConv1d, GridConv2d, GridConv3d
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
    "QuadraticPositionalAttention",
    "RGCNConv",
    "SGConv",
    "StructConv",
    "TAGConv",
]
