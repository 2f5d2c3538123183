r"""The framework's propositions as functions (Andreoli, §1.1–1.2).

* :func:`combine`: :math:`\Phi = \mathbf{A}\circ\Theta = \sum_k A_k \otimes \Theta_k`, the
  general linear map of shape ``(M, N, P, Q)`` that a convolution restricts (Eq. 6–7).
* :func:`decompose` (Proposition 1): when the members of :math:`\mathbf{A}` form a basis of all
  :math:`M\times N` matrices (so :math:`K = MN`), every :math:`\Phi` has exactly one
  :math:`\Theta` with :math:`\Phi = \mathbf{A}\circ\Theta`.
* :func:`compose` (Proposition 3): two convolutions in sequence are one convolution of size
  :math:`K'K''` with :math:`A_{(k',k'')} = A'_{k'}A''_{k''}` and
  :math:`\Theta_{(k',k'')} = \Theta'_{k'}\Theta''_{k''}`, pairs flattened row-major.
"""

from __future__ import annotations

import numpy as np

from ..backend import Array, einsum, namespace, of, shape_str, to_numpy
from ..backend.checks import check_array, check_same_placement
from ..bases.base import Basis
from ..bases.composite import ComposedBasis
from ..bases.convert import as_basis
from ..bases.dense import DenseBasis
from ..bases.sparse import SparseBasis


def _check_theta(theta: Array, basis: Basis, arg: str) -> None:
    check_array(theta, arg, (3,), ("(K, P, Q)",))
    if int(theta.shape[0]) != basis.K:
        raise ValueError(f"{arg} has shape {shape_str(tuple(theta.shape))} but its basis has K={basis.K}")


def combine(a: Basis | Array, theta: Array) -> Array:
    r"""Return :math:`\Phi = \sum_k A_k\otimes\Theta_k`, shape ``(M, N, P, Q)`` (or with ``B`` first).

    Then ``conv(a, x, theta)[b, n, q] == sum(x[b, m, p] * phi[m, n, p, q])``: the general linear
    map of Eq. 6 that the convolution is (formed densely).

    Parameters
    ----------
    a
        A basis ``(K, M, N)`` or ``(B, K, M, N)``, or a dense array of that shape.
    theta
        :math:`\Theta`, ``(K, P, Q)``, placed like the basis.

    Returns
    -------
    Array
        :math:`\Phi_{mnpq} = \sum_k A_{kmn}\Theta_{kpq}`, ``(M, N, P, Q)`` or ``(B, M, N, P, Q)``.

    Raises
    ------
    ValueError, TypeError
        If ``theta`` is not ``(K, P, Q)`` with the basis' ``K``, or is placed otherwise.

    Examples
    --------
    >>> import numpy as np
    >>> from structconv import combine
    >>> combine(np.ones((2, 3, 4)), np.ones((2, 5, 6))).shape
    (3, 4, 5, 6)
    """
    basis = as_basis(a)
    _check_theta(theta, basis, "theta")
    dense = basis.to_dense()
    check_same_placement({"basis": dense, "theta": theta})
    if basis.batch is None:
        return einsum("kmn,kpq->mnpq", dense, theta)
    return einsum("bkmn,kpq->bmnpq", dense, theta)


def decompose(a: Basis | Array, phi: Array) -> Array:
    r"""Find the unique :math:`\Theta` with :math:`\Phi = \mathbf{A}\circ\Theta` (Proposition 1).

    Parameters
    ----------
    a
        A basis of shape ``(K, M, N)`` whose members span all ``M x N`` matrices (``K = M N``
        and linearly independent).
    phi
        A tensor of shape ``(M, N, P, Q)``.

    Returns
    -------
    Array
        :math:`\Theta` of shape ``(K, P, Q)``.

    Raises
    ------
    ValueError
        If the basis is per-instance, ``K != M N``, its members are linearly dependent, or
        ``phi`` has the wrong shape.

    Examples
    --------
    >>> import numpy as np
    >>> from structconv import combine, decompose
    >>> rng = np.random.default_rng(1)
    >>> A, theta = rng.normal(size=(6, 2, 3)), rng.normal(size=(6, 4, 5))
    >>> bool(np.allclose(decompose(A, combine(A, theta)), theta))
    True
    """
    basis = as_basis(a)
    if basis.batch is not None:
        raise ValueError("decompose needs a basis shared by the batch, shape (K, M, N)")
    K, M, N = basis.shape
    if K != M * N:
        raise ValueError(f"decompose needs a full basis with K = M*N = {M * N} members, got K={K}")
    check_array(phi, "phi", (4,), (f"({M}, {N}, P, Q)",))
    if tuple(int(s) for s in phi.shape[:2]) != (M, N):
        raise ValueError(f"phi has shape {shape_str(tuple(phi.shape))}; expected ({M}, {N}, P, Q)")
    dense = basis.to_dense()
    check_same_placement({"basis": dense, "phi": phi})
    P, Q = int(phi.shape[2]), int(phi.shape[3])
    gram_t = dense.reshape(K, M * N).T
    rank = int(np.linalg.matrix_rank(to_numpy(gram_t)))
    if rank < K:
        raise ValueError(f"the basis members are linearly dependent (rank {rank} < K={K}); Proposition 1 needs a basis")
    theta = namespace(dense).linalg.solve(gram_t, phi.reshape(M * N, P * Q))
    return theta.reshape(K, P, Q)


def compose(a1: Basis | Array, theta1: Array, a2: Basis | Array, theta2: Array) -> tuple[Basis, Array]:
    r"""Fuse two convolutions applied in sequence into one (Proposition 3).

    ``conv(a2, conv(a1, x, theta1), theta2) == conv(a, x, theta)`` where
    ``a, theta = compose(a1, theta1, a2, theta2)``, ``K = K' K''`` and member ``k' K'' + k''``
    is the pair :math:`(k', k'')`.

    Dense and sparse operands give a basis of the same representation (sparse products are
    computed sparsely); other representations give a lazy :class:`~structconv.ComposedBasis`.

    Parameters
    ----------
    a1, theta1
        The first convolution: a basis :math:`\mathbf A'` ``(K', M', N')`` (or an array) and
        :math:`\Theta'` ``(K', P', Q')``.
    a2, theta2
        The second: :math:`\mathbf A''` ``(K'', M'', N'')`` and :math:`\Theta''` ``(K'', P'', Q'')``.

    Returns
    -------
    (Basis, Array)
        :math:`A_{k'K''+k''} = A'_{k'}A''_{k''}`, ``(K'K'', M', N'')``, and
        :math:`\Theta_{k'K''+k''} = \Theta'_{k'}\Theta''_{k''}`, ``(K'K'', P', Q'')``.

    Raises
    ------
    ValueError
        If the output entries and channels of the first convolution do not match the inputs of
        the second (:math:`\langle N', Q'\rangle = \langle M'', P''\rangle`).
    """
    b1, b2 = as_basis(a1), as_basis(a2)
    _check_theta(theta1, b1, "theta1")
    _check_theta(theta2, b2, "theta2")
    check_same_placement({"theta1": theta1, "theta2": theta2})
    if b1.N != b2.M:
        raise ValueError(f"a1 has N={b1.N} output entries but a2 has M={b2.M} input entries; they must agree")
    if int(theta1.shape[2]) != int(theta2.shape[1]):
        raise ValueError(f"theta1 has Q={int(theta1.shape[2])} output channels but theta2 has P={int(theta2.shape[1])}")
    if b1.batch != b2.batch:
        raise ValueError(f"a1 has batch {b1.batch} but a2 has batch {b2.batch}")
    k1, k2 = b1.K, b2.K
    theta = einsum("kpq,lqr->klpr", theta1, theta2).reshape(k1 * k2, int(theta1.shape[1]), int(theta2.shape[2]))
    basis: Basis
    if isinstance(b1, DenseBasis) and isinstance(b2, DenseBasis):
        if b1.batch is None:
            prod = einsum("kmj,ljn->klmn", b1.array, b2.array).reshape(k1 * k2, b1.M, b2.N)
        else:
            prod = einsum("bkmj,bljn->bklmn", b1.array, b2.array).reshape(b1.batch, k1 * k2, b1.M, b2.N)
        basis = DenseBasis(prod)
    elif isinstance(b1, SparseBasis) and isinstance(b2, SparseBasis):
        basis = _sparse_product(b1, b2)
    elif b1.batch is None:
        basis = ComposedBasis(b1, b2)
    else:
        basis = DenseBasis(compose(DenseBasis(b1.to_dense()), theta1, DenseBasis(b2.to_dense()), theta2)[0].to_dense())
    return basis, theta


def _sparse_product(b1: SparseBasis, b2: SparseBasis) -> SparseBasis:
    """All products :math:`A'_{k'}A''_{k''}` as one block sparse-sparse product."""
    B = b1.batch or 1
    K1, M, J = b1.shape[-3:]
    K2, _, N = b2.shape[-3:]
    i1, i2 = b1.indices, b2.indices
    bb1 = i1[0] if b1.batch is not None else 0
    bb2 = i2[0] if b2.batch is not None else 0
    rows1, cols1 = (bb1 * K1 + i1[-3]) * M + i1[-2], bb1 * J + i1[-1]
    rows2, cols2 = bb2 * J + i2[-2], (bb2 * K2 + i2[-3]) * N + i2[-1]
    shapes = (B * K1 * M, B * J, B * K2 * N)
    left, right = (rows1, cols1, b1.values), (rows2, cols2, b2.values)
    rows, cols, values = of(b1.values).sparse_product(left, right, shapes)
    b = rows // (K1 * M)
    k = ((rows // M) % K1) * K2 + (cols // N) % K2
    m, n = rows % M, cols % N
    stack = namespace(values).stack
    if b1.batch is None:
        return SparseBasis(stack([k, m, n]), values, (K1 * K2, M, N))
    return SparseBasis(stack([b, k, m, n]), values, (B, K1 * K2, M, N))


__all__ = ["combine", "compose", "decompose"]
