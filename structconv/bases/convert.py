"""Turning arrays into bases: :func:`as_basis`.

It sits above the representations it chooses between (dense, sparse), so that
:mod:`structconv.bases.base` needs none of them.
"""

from __future__ import annotations

from ..backend import Array, of
from .base import Basis
from .dense import DenseBasis
from .sparse import SparseBasis


def as_basis(a: Basis | Array) -> Basis:
    """Interpret ``a`` as a basis.

    Parameters
    ----------
    a
        A :class:`Basis` (returned unchanged), a dense array of shape ``(K, M, N)`` or
        ``(B, K, M, N)``, or a torch sparse COO tensor of either shape.

    Raises
    ------
    TypeError
        If ``a`` is none of these.

    Examples
    --------
    >>> import numpy as np
    >>> from structconv import as_basis
    >>> as_basis(np.ones((2, 3, 4))).representation
    'dense'
    """
    if isinstance(a, Basis):
        return a
    if of(a, "basis").is_sparse(a):
        return SparseBasis.from_torch(a)
    return DenseBasis(a)


__all__ = ["as_basis"]
