"""Readers for benchmark datasets, returning torch tensors."""

from .cifar import Cifar10, load_cifar10
from .planetoid import Planetoid, load_planetoid

__all__ = ["Cifar10", "Planetoid", "load_cifar10", "load_planetoid"]
