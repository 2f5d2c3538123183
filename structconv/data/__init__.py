"""Readers for benchmark datasets, returning torch tensors."""

from .planetoid import Planetoid, load_planetoid

__all__ = ["Planetoid", "load_planetoid"]
