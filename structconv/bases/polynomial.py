r"""Polynomial bases: members :math:`p_d(S)` of one square sparse matrix :math:`S`, never formed.

TAGConv's powers :math:`S^0, \dots, S^K` and ChebConv's Chebyshev polynomials
:math:`T_0(\hat L), \dots, T_{K-1}(\hat L)` are applied by repeated products with :math:`S` (the
three-term recurrence forwards, Horner's or Clenshaw's rule backwards).  The basis runs every
product itself, through its matrix's hooks; the engine calls it, never the other way round.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..backend import Array, as_index, concatenate, einsum, namespace, of, x_theta
from .base import Basis, Cost, OwnOrder, _member_list
from .sparse import Derived, SparseBasis


class PolynomialBasis(Basis):
    r"""Members :math:`p_{d}(S)` for chosen degrees :math:`d` of a square sparse matrix :math:`S`.

    ``family="powers"`` has :math:`p_d(S) = S^d`; ``family="chebyshev"`` has the Chebyshev
    polynomials :math:`T_0 = I`, :math:`T_1 = S`, :math:`T_d = 2S\,T_{d-1} - T_{d-2}`.

    The members are never formed: :meth:`apply_each` runs the three-term recurrence on
    :math:`x` (:math:`D` sparse products for degree :math:`D`), and the reduced
    :meth:`apply_members` runs it backwards (Horner's rule for powers, Clenshaw's for
    Chebyshev), again :math:`D` sparse products.  The engine's ``"materialized"`` order forms
    the sparse matrices :math:`p_d(S)` instead, which pays when they stay sparse and many
    channels or instances share them; that order, too, runs here, on the formed members'
    own products.  The basis is a value: the formed members are kept (unless they are
    differentiable) in a cache created with the basis, a function of it alone.

    Parameters
    ----------
    matrix
        :math:`S` as a one-member :class:`~structconv.SparseBasis` of shape ``(1, N, N)``.
    degrees
        The degrees of the members, in order (e.g. ``range(K + 1)`` for TAGConv, ``[K]`` for SGConv).
        A ``range`` is kept as it is: however high the order, the basis costs nothing until applied.
    family
        ``"powers"`` or ``"chebyshev"``.
    """

    __slots__ = ("_degrees", "_derived", "_family", "_matrix", "_top")
    representation = "polynomial"
    host_orders = frozenset({"atheta", "materialized"})

    def __init__(self, matrix: SparseBasis, degrees: Sequence[int], family: str = "powers") -> None:
        if not isinstance(matrix, SparseBasis) or matrix.shape[0] != 1 or matrix.M != matrix.N:
            raise ValueError("matrix must be a one-member square SparseBasis of shape (1, N, N)")
        if family not in ("powers", "chebyshev"):
            raise ValueError(f"family must be 'powers' or 'chebyshev', got {family!r}")
        degs = degrees if isinstance(degrees, range) else tuple(int(d) for d in degrees)
        ends = (degs[0], degs[-1]) if isinstance(degs, range) and degs else degs  # a range's extremes: its ends
        if not degs or min(ends) < 0:
            raise ValueError(f"degrees must be non-empty and non-negative, got {degrees!r}")
        self._matrix, self._degrees, self._family, self._top = matrix, degs, family, max(ends)
        self._derived = Derived()

    @property
    def matrix(self) -> SparseBasis:
        return self._matrix

    @property
    def degrees(self) -> Sequence[int]:
        return self._degrees

    @property
    def family(self) -> str:
        return self._family

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self._degrees), self._matrix.M, self._matrix.N)

    @property
    def backend(self) -> str:
        return self._matrix.backend

    @property
    def dtype(self) -> Any:
        return self._matrix.dtype

    @property
    def device(self) -> str:
        return self._matrix.device

    def plan_key(self) -> tuple[Any, ...]:
        return (type(self).__name__, self.shape, self._matrix.stored, self._degrees, self._family)

    # --- the recurrence ----------------------------------------------------------------------
    def _step(self, v: Array) -> Array:
        r""":math:`S^\top v` for ``v`` of shape ``(B, N, C)``."""
        return self._matrix.apply_each(v)[:, 0]

    def _forward(self, v: Array, upto: int) -> list[Array]:
        """:math:`p_d(S)^\\top v` for d = 0..upto."""
        out = [v]
        if upto >= 1:
            out.append(self._step(v))
        for _ in range(2, upto + 1):
            nxt = self._step(out[-1])
            out.append(2 * nxt - out[-2] if self._family == "chebyshev" else nxt)
        return out

    def _backward_sum(self, terms: dict[int, Array], like: Array) -> Array:
        r""":math:`\sum_d p_d(S)^\top t_d` by Horner (powers) or Clenshaw (Chebyshev)."""
        top = max(terms)
        zero = like * 0
        if self._family == "powers":
            acc = terms.get(top, zero)
            for d in range(top - 1, -1, -1):
                acc = self._step(acc) + terms.get(d, zero)
            return acc
        b1, b2 = zero, zero  # b_{d+1}, b_{d+2}
        for d in range(top, 0, -1):
            b1, b2 = terms.get(d, zero) + 2 * self._step(b1) - b2, b1
        return terms.get(0, zero) + self._step(b1) - b2

    def apply_each(self, x: Array) -> Array:
        powers = self._forward(x, self._top)
        stack = namespace(x).stack
        return stack([powers[d] for d in self._degrees], 1)

    def apply_members(self, s: Array, *, reduce: bool) -> Array:
        if reduce:
            terms: dict[int, Array] = {}
            for k, d in enumerate(self._degrees):
                terms[d] = terms[d] + s[:, k] if d in terms else s[:, k]
            return self._backward_sum(terms, s[:, 0])
        stack = namespace(s).stack
        return stack([self._forward(s[:, k], d)[d] for k, d in enumerate(self._degrees)], 1)

    def _products(self, batch: int, channels: int) -> float:
        return 2.0 * self._matrix.stored * batch * channels * self._top

    def cost_each(self, batch: int, channels: int) -> Cost:
        D = self._top
        return Cost(0.0, float(batch * (self.K + D) * self.N * channels), self._products(batch, channels))

    def cost_members(self, batch: int, channels: int, *, reduce: bool) -> Cost:
        D = self._top
        factor = 1.0 if reduce else float(self.K)
        return Cost(0.0, float(batch * (self.K + D) * self.N * channels), factor * self._products(batch, channels))

    # --- materialising --------------------------------------------------------------------------
    def materialize(self) -> SparseBasis:
        """The members as one sparse basis, formed by sparse-sparse products (kept unless differentiable)."""
        values = self._matrix.values
        backend = of(values)
        members: SparseBasis = self._derived.get(
            "materialized", self._materialize, keep=not backend.requires_grad(values)
        )
        return members

    def _materialize(self) -> SparseBasis:
        S = self._matrix
        index, values = S.indices, S.values
        parts = of(values).sparse_polynomials(index[1], index[2], values, S.N, tuple(self._degrees), self._family)
        members = [as_index(np.full(int(v.shape[0]), k), index) for k, (_, _, v) in enumerate(parts)]
        stack = namespace(values).stack
        rows = concatenate([stack([k, r, c]) for k, (r, c, _) in zip(members, parts, strict=True)], 1)
        return SparseBasis(rows, concatenate([v for _, _, v in parts], 0), self.shape)

    def _estimated_nnz(self) -> float:
        """An upper estimate of the stored entries of every member (for the planner)."""
        N = self.N
        avg = max(self._matrix.stored / N, 1.0)
        return float(sum(min(N * N, N * avg**d if d else N) for d in self._degrees))

    def own_orders(self) -> Mapping[str, OwnOrder]:
        """``"materialized"``: the members formed as sparse matrices, then their own products."""
        return _POLYNOMIAL_ORDERS

    def _run_materialized(self, x: Array, theta: Array) -> Array:
        members = self.materialize()
        # The cost (_cost_materialized) assumes the cheaper side of the channels: A·x first when
        # P <= Q, else x·Θ first (one GEMM), then the members' reduced product.
        if int(theta.shape[1]) <= int(theta.shape[2]):
            result: Array = einsum("bknp,kpq->bnq", members.apply_each(x), theta)
            return result
        return members.apply_members(x_theta(x, theta), reduce=True)

    def _cost_materialized(self, batch: int, p: int, q: int) -> Cost:
        nnz = self._estimated_nnz()
        # Forming the members is counted whether or not they are kept: a plan is shared by every
        # basis of the same plan key, formed or not.
        build = 2.0 * self._matrix.stored * nnz
        channels = min(p, q)
        gemm = 2.0 * batch * self.N * self.K * p * q
        return Cost(gemm, float(nnz + batch * self.K * self.N * channels), build + 2.0 * nnz * batch * channels)

    # --- value operations ----------------------------------------------------------------------
    def to_dense(self) -> Array:
        S = self._matrix.to_dense()[0]
        eye = of(S).eye(int(S.shape[0]), S)
        mats = [eye, S]
        for _ in range(2, self._top + 1):
            nxt = mats[-1] @ S
            mats.append(2 * nxt - mats[-2] if self._family == "chebyshev" else nxt)
        return namespace(S).stack([mats[d] for d in self._degrees])

    def transpose(self) -> PolynomialBasis:
        r""":math:`p_d(S)^\top = p_d(S^\top)`."""
        return PolynomialBasis(self._matrix.transpose(), self._degrees, self._family)

    def select(self, members: Sequence[int]) -> PolynomialBasis:
        return PolynomialBasis(self._matrix, [self._degrees[k] for k in _member_list(members)], self._family)

    def to(self, device: Any = None, dtype: Any = None) -> PolynomialBasis:
        return PolynomialBasis(self._matrix.to(device=device, dtype=dtype), self._degrees, self._family)

    def energy(self) -> float:
        return self.materialize().energy()

    def __repr__(self) -> str:
        return (
            f"PolynomialBasis(family={self._family!r}, degrees={self._degrees}, N={self.N}, "
            f"nnz(S)={self._matrix.stored}, backend={self.backend}, dtype={self.dtype})"
        )


_POLYNOMIAL_ORDERS: Mapping[str, OwnOrder] = {
    "materialized": OwnOrder(PolynomialBasis._cost_materialized, PolynomialBasis._run_materialized)
}
