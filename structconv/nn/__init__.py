"""Torch layers, each a basis plus a parameter over :func:`structconv.conv`."""

from .grid import AvgPool1d, AvgPool2d, AvgPool3d, GridConv1d, GridConv2d, GridConv3d
from .structconv import StructConv

__all__ = ["AvgPool1d", "AvgPool2d", "AvgPool3d", "GridConv1d", "GridConv2d", "GridConv3d", "StructConv"]
