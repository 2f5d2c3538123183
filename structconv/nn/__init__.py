"""Torch layers, each a basis plus a parameter over :func:`structconv.conv`."""

from .structconv import StructConv

__all__ = ["StructConv"]
