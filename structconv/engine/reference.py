r"""The reference every order of the engine must equal: the naive dense einsum.

:math:`y_{bnq} = \sum_{k,m,p} A_{kmn}\, x_{bmp}\, \Theta_{kpq}` (or :math:`A_{bkmn}` for a
per-instance basis), by the array library's own ``einsum`` in one call: no contraction path, no
hook of a representation, nothing of the engine, so that it can judge the engine.  It lives
here, below :mod:`structconv.theory` (whose self-check uses it), and is re-exported by
:mod:`structconv.testing` for the tests and for users' own checks.
"""

from __future__ import annotations

from ..backend import Array, find, native
from ..bases.base import Basis
from ..bases.factor import LowRank, Separable, Theta


def dense_reference(a: Basis | Array, x: Array, theta: Theta) -> Array:
    r"""Compute :math:`y_b = \sum_k A_k^\top x_b \Theta_k` by one dense ``einsum``, ``"kmn,bmp,kpq->bnq"``.

    Parameters
    ----------
    a
        The basis: a dense array of shape ``(K, M, N)`` or ``(B, K, M, N)`` (per instance), or a
        :class:`~structconv.Basis`, taken in its dense form (:meth:`~structconv.Basis.to_dense`).
    x
        Input of shape ``(B, M, P)`` or ``(M, P)``, on the same backend as ``a``.
    theta
        Parameter of shape ``(K, P, Q)``, or a :class:`~structconv.Separable` /
        :class:`~structconv.LowRank` one, formed in full first (by ``einsum`` too); any other
        form of a parameter is formed by its ``full()``.

    Returns
    -------
    Array
        ``y`` of shape ``(B, N, Q)``, or ``(N, Q)`` for a 2-D ``x``, on the backend of ``x``.

    Examples
    --------
    >>> import numpy as np
    >>> from structconv.engine.reference import dense_reference
    >>> A, x, theta = np.ones((2, 3, 4)), np.ones((5, 3, 6)), np.ones((2, 6, 7))
    >>> dense_reference(A, x, theta).shape, float(dense_reference(A, x[0], theta)[0, 0])
    ((5, 4, 7), 36.0)
    """
    dense = a.to_dense() if isinstance(a, Basis) else a
    # The array library's own einsum throughout (NumPy's without ``optimize``), the factors'
    # products included: the engine's opt_einsum paths and ``full()`` are among what is judged.
    lib = native(x)
    if isinstance(theta, Separable):
        full = lib.einsum("hk,hpq->kpq", theta.basis_coef, theta.channel)
    elif isinstance(theta, LowRank):
        full = lib.einsum("kpd,kqd->kpq", theta.value, theta.out)
    elif find(theta) is None:  # another held form of a parameter: its own full form
        full = theta.full()
    else:
        full = theta
    squeeze = x.ndim == 2
    xb = x[None] if squeeze else x
    equation = "bkmn,bmp,kpq->bnq" if dense.ndim == 4 else "kmn,bmp,kpq->bnq"
    y = lib.einsum(equation, dense, xb, full)
    return y[0] if squeeze else y


__all__ = ["dense_reference"]
