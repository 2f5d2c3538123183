"""Torch layers, each a basis plus a parameter over :func:`structconv.conv`."""

from .attention import MultiHeadSelfAttention
from .cheb import ChebConv
from .gat import GATConv
from .gcn import GCNConv, SGConv
from .gin import GINConv
from .graph_common import GraphLayer
from .grid import GridConv1d, GridConv2d, GridConv3d
from .grid_layer import GridLayer
from .pool import AvgPool1d, AvgPool2d, AvgPool3d
from .positional import PositionalAttention
from .positional_heads import ContentHeads, GaussianHeads, LearnedHeads, PositionalHeads, QuadraticHeads
from .rgcn import RGCNConv
from .sage import SAGEConv
from .structconv import StructConv
from .tag import TAGConv

__all__ = [
    "AvgPool1d",
    "AvgPool2d",
    "AvgPool3d",
    "ChebConv",
    "ContentHeads",
    "GATConv",
    "GCNConv",
    "GINConv",
    "GaussianHeads",
    "GraphLayer",
    "GridConv1d",
    "GridConv2d",
    "GridConv3d",
    "GridLayer",
    "LearnedHeads",
    "MultiHeadSelfAttention",
    "PositionalAttention",
    "PositionalHeads",
    "QuadraticHeads",
    "RGCNConv",
    "SAGEConv",
    "SGConv",
    "StructConv",
    "TAGConv",
]
