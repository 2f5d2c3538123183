r"""Kronecker bases, :math:`A_k = A^{(1)}_k\otimes\cdots\otimes A^{(d)}_k`: members acting on each grid axis apart.

Separable position-only heads have this form (:meth:`structconv.PositionScores.basis`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from ..backend import Array, native, of, shape_str
from ..backend.checks import check_array, check_finite
from .base import Cost, OwnOrder, _member_list, _PlacedByArray
from .dense import DenseBasis


def _structured(factors: tuple[Array, ...]) -> tuple[Array, ...]:
    """``factors`` after checking their ranks, member counts and backends (not their values)."""
    if not factors:
        raise ValueError("factors must hold at least one (K, m_i, n_i) array")
    for i, f in enumerate(factors):
        check_array(f, f"factors[{i}]", (3,), ("(K, m_i, n_i)",))
    members = {int(f.shape[0]) for f in factors}
    if len(members) != 1:
        raise ValueError(f"every factor must have the same number of members K, got {sorted(members)}")
    if len({of(f, f"factors[{i}]").name for i, f in enumerate(factors)}) != 1:
        raise TypeError("factors must all be NumPy arrays or all torch tensors")
    return factors


class KroneckerBasis(_PlacedByArray):
    """A basis whose members are Kronecker products of per-axis factors ``(K, m_i, n_i)``.

    Parameters
    ----------
    factors
        One ``(K, m_i, n_i)`` array per axis, all with the same ``K`` and backend; the basis
        is ``(K, prod m_i, prod n_i)``.

    Examples
    --------
    >>> import numpy as np
    >>> from structconv.bases.kronecker import KroneckerBasis
    >>> rng = np.random.default_rng(0)
    >>> A = KroneckerBasis([rng.random((2, 3, 3)), rng.random((2, 4, 4))])
    >>> (f, g), dense = A.factors, A.to_dense()
    >>> A.shape, bool(np.allclose(dense[1], np.kron(f[1], g[1])))
    ((2, 12, 12), True)
    """

    __slots__ = ("_factors",)
    representation = "kronecker"

    def __init__(self, factors: Sequence[Array]) -> None:
        self._factors = _structured(tuple(factors))
        for i, f in enumerate(self._factors):
            check_finite(f, f"factors[{i}]")

    @classmethod
    def of_weights(cls, factors: Sequence[Array]) -> KroneckerBasis:
        """Wrap finite factors the library has just computed (softmaxes): shapes checked, values not read back."""
        basis = cls.__new__(cls)
        basis._factors = _structured(tuple(factors))
        return basis

    @classmethod
    def of_built(cls, factors: tuple[Array, ...]) -> KroneckerBasis:
        """Wrap factors that code already checked has built (a warm layer's call: its key fixes them): no check."""
        basis = cls.__new__(cls)
        basis._factors = factors
        return basis

    @property
    def factors(self) -> tuple[Array, ...]:
        """The per-axis factors ``(K, m_i, n_i)``."""
        return self._factors

    @property
    def shape(self) -> tuple[int, ...]:
        f = self._factors
        # Lists, not generators: torch.compile traces a list, and breaks the graph at a generator.
        return (int(f[0].shape[0]), math.prod([int(a.shape[1]) for a in f]), math.prod([int(a.shape[2]) for a in f]))

    def _placed(self) -> Array:
        return self._factors[0]

    def to_dense(self) -> Array:
        out = self._factors[0]
        for f in self._factors[1:]:
            K, a, b = out.shape
            _, c, e = f.shape
            # Entrywise products of broadcast views: no product kernel, and under autocast no
            # rounding of the factors to its dtype first.
            out = (out.reshape(K, a, 1, b, 1) * f.reshape(K, 1, c, 1, e)).reshape(K, a * c, b * e)
        if len(self._factors) == 1:
            return out
        # Products of normal factors can be subnormal, which makes every later CPU GEMM with the
        # dense form about ten times slower; they are below 1e-37 and flushed to zero.
        return of(out).flush_subnormals(out)

    def transpose(self) -> KroneckerBasis:
        return KroneckerBasis.of_weights([f.swapaxes(-1, -2) for f in self._factors])

    def select(self, members: Sequence[int]) -> KroneckerBasis:
        index = _member_list(members)
        return KroneckerBasis.of_weights([f[index] for f in self._factors])

    def to(self, device: Any = None, dtype: Any = None) -> KroneckerBasis:
        # Each factor moves as a dense basis of its own would (same rules and messages).
        return KroneckerBasis.of_weights([DenseBasis.of_weights(f).to(device, dtype).to_dense() for f in self._factors])

    # --- the per-axis passes: every product one (batched) GEMM on row-major views, rows in the order
    # (n_1, B, n_2, ..., n_d) with the members outermost, so no K-fold intermediate is copied to
    # reorder it between axes; one copy is left where the members meet Θ.
    def _sizes(self) -> tuple[list[int], list[int]]:
        return [int(f.shape[1]) for f in self._factors], [int(f.shape[2]) for f in self._factors]

    def _rows(self, x: Array) -> Array:
        r"""``x`` ``(B, M, C)`` as ``(m_1, B\,m_2 \cdots m_d\,C)``, the first axis in front (one copy of ``x``)."""
        B, M, C = (int(v) for v in x.shape)
        m1 = int(self._factors[0].shape[1])
        return x.reshape(B, m1, (M // m1) * C).swapaxes(0, 1).reshape(m1, -1)

    def _passes(self, t: Array, batch: int, channels: int) -> Array:
        r"""Every member's factors applied to ``t``: ``(K, n_1 B n_2 \cdots n_d, C)``.

        ``t`` is ``(m_1, B m_2 \cdots m_d C)``, shared by the members (their first factors then
        run as one GEMM), or ``(K, m_1, \dots)``, one slice per member.
        """
        ins, outs = self._sizes()
        K, first = self.K, self._factors[0].swapaxes(1, 2)
        # Shared by the members: their first factors stacked into one GEMM.
        t = (first.reshape(K * outs[0], ins[0]) @ t).reshape(K, outs[0], -1) if t.ndim == 2 else first @ t
        lead = outs[0] * batch
        for i in range(1, len(ins)):
            t = self._factors[i].swapaxes(1, 2)[:, None] @ t.reshape(K, lead, ins[i], -1)
            lead *= outs[i]
        return t.reshape(K, lead, channels)

    def _unrows(self, y: Array, batch: int) -> Array:
        r"""``(..., n_1 B n_2 \cdots n_d, C)`` back to ``(B, ..., N, C)``."""
        n1, C, front = int(self._factors[0].shape[2]), int(y.shape[-1]), tuple(int(v) for v in y.shape[:-2])
        y = y.reshape(*front, n1, batch, -1)
        return native(y).moveaxis(y, -2, 0).reshape(batch, *front, self.N, C)

    def apply_each(self, x: Array) -> Array:
        B, _, C = (int(v) for v in x.shape)
        return self._unrows(self._passes(self._rows(x), B, C), B)

    def apply_members(self, s: Array, *, reduce: bool) -> Array:
        B, K, _, C = (int(v) for v in s.shape)
        m1 = int(self._factors[0].shape[1])
        t = native(s).moveaxis(s.reshape(B, K, m1, -1), 0, 2).reshape(K, m1, -1)  # (K, m_1, B m_2..m_d C)
        out = self._passes(t, B, C)
        return self._unrows(out.sum(0), B) if reduce else self._unrows(out, B)

    def _ax(self, x: Array, theta: Array) -> Array:
        """A·x first: the passes on ``x`` shared by the members, then one GEMM over ``(k, p)``.

        Outside autograd one member at a time, accumulated into the output, so the K-fold
        intermediate is never written; under autograd batched (slices would be stacked again).
        """
        B, _, P = (int(v) for v in x.shape)
        K, Q = self.K, int(theta.shape[2])
        rows = self._rows(x)
        backend = of(x)
        if not backend.recording(x, theta, *self._factors):
            y = None
            for k in range(K):
                member = KroneckerBasis.of_weights([f[k : k + 1] for f in self._factors])
                r = member._passes(rows, B, P)[0]
                y = r @ theta[k] if y is None else backend.addmm_(y, r, theta[k])
            return self._unrows(y, B)
        r = self._passes(rows, B, P)
        return self._unrows(r.swapaxes(0, 1).reshape(-1, K * P) @ theta.reshape(K * P, Q), B)

    def _values(self, x: Array, w: Array) -> Array:
        """``x W_k`` for every member (one batched GEMM), then the passes: ``(K, rows, D)``."""
        B, _, P = (int(v) for v in x.shape)
        m1 = int(self._factors[0].shape[1])
        s = self._rows(x).reshape(-1, P) @ w  # (K, m_1 B m_2..m_d, D)
        return self._passes(s.reshape(self.K, m1, -1), B, int(w.shape[2]))

    def _xtheta(self, x: Array, theta: Array) -> Array:
        return self._unrows(self._values(x, theta).sum(0), int(x.shape[0]))

    def _xtheta_factored(self, x: Array, value: Array, out: Array) -> Array:
        K, D, Q = self.K, int(value.shape[2]), int(out.shape[1])
        z = self._values(x, value).swapaxes(0, 1).reshape(-1, K * D)
        return self._unrows(z @ out.swapaxes(1, 2).reshape(K * D, Q), int(x.shape[0]))

    def own_orders(self) -> Mapping[str, OwnOrder]:
        """``"ax"``, ``"xtheta"`` as plain GEMMs over row-major views (:meth:`_passes`)."""
        return _KRONECKER_ORDERS

    def _flops(self, batch: int, channels: int) -> float:
        ins, outs = self._sizes()
        total = 0.0
        for i in range(len(ins)):
            size = math.prod(outs[:i]) * math.prod(ins[i + 1 :])
            total += 2.0 * batch * self.K * channels * size * ins[i] * outs[i]
        return total

    def _written(self, batch: int, channels: int) -> float:
        """Elements the passes write: one K-fold intermediate per axis."""
        return float(len(self._factors) * batch * self.K * max(self.M, self.N) * channels)

    def cost_each(self, batch: int, channels: int) -> Cost:
        moved = batch * (self.M + self.K * self.N) * channels  # x to rows, the result back
        return Cost(self._flops(batch, channels), self._written(batch, channels) + moved)

    def cost_members(self, batch: int, channels: int, *, reduce: bool) -> Cost:
        moved = batch * channels * (self.K * self.M + self.N * (1 if reduce else self.K))
        return Cost(self._flops(batch, channels), self._written(batch, channels) + moved)

    def _cost_ax(self, batch: int, p: int, q: int) -> Cost:
        B, K, N = batch, self.K, self.N
        gemm = Cost(2.0 * B * N * K * p * q, float(B * K * N * p + 2 * B * N * q))
        return gemm + Cost(self._flops(B, p), self._written(B, p) + B * self.M * p)

    def _cost_values(self, batch: int, p: int, d: int) -> Cost:
        B, K, M = batch, self.K, self.M
        return Cost(2.0 * B * M * p * K * d + self._flops(B, d), float(B * M * p + B * K * M * d) + self._written(B, d))

    def _cost_xtheta(self, batch: int, p: int, q: int) -> Cost:
        return self._cost_values(batch, p, q) + Cost(float(batch * self.K * self.N * q), float(2 * batch * self.N * q))

    def _cost_xtheta_factored(self, batch: int, p: int, q: int, rank: int) -> Cost:
        B, K, N = batch, self.K, self.N
        out = Cost(2.0 * B * N * K * rank * q, float(B * N * K * rank + 2 * B * N * q))
        return self._cost_values(B, p, rank) + out

    def __repr__(self) -> str:
        shapes = " ⊗ ".join(shape_str(tuple(f.shape[1:])) for f in self._factors)
        return f"KroneckerBasis(K={self.K}, {shapes}, backend={self.backend}, dtype={self.dtype})"


_KRONECKER_ORDERS: Mapping[str, OwnOrder] = {
    "ax": OwnOrder(KroneckerBasis._cost_ax, KroneckerBasis._ax),
    "xtheta": OwnOrder(
        KroneckerBasis._cost_xtheta,
        KroneckerBasis._xtheta,
        KroneckerBasis._cost_xtheta_factored,
        KroneckerBasis._xtheta_factored,
    ),
}
