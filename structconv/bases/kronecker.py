r"""Kronecker bases: members that act on each axis of a grid separately.

:math:`A_k = A^{(1)}_k\otimes\cdots\otimes A^{(d)}_k`, with factors of shape ``(K, m_i, n_i)``
and entries indexed row-major over the grid (as everywhere in structconv).  Applying a member
costs :math:`\sum_i m_i\prod_{j\ne i}(\cdot)` per channel instead of :math:`MN`: on a
:math:`16\times16` grid, 32 instead of 256 per output.  Position-only attention heads whose
scores are a sum of per-axis terms (the quadratic encoding, learned row and column tables) have
exactly this form after the softmax, because the exponential of a sum is a product and the set of
grid positions is a product set (:meth:`structconv.structures.positional.PositionalMechanism.basis`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..backend import Array, device_of, einsum, native, of, shape_str
from ..backend.checks import check_array, check_finite
from .base import Basis, Cost
from .dense import DenseBasis


class KroneckerBasis(Basis):
    """A basis whose members are Kronecker products of per-axis factors ``(K, m_i, n_i)``.

    Examples
    --------
    >>> import numpy as np
    >>> from structconv.bases.kronecker import KroneckerBasis
    >>> rng = np.random.default_rng(0)
    >>> A = KroneckerBasis([rng.random((2, 3, 3)), rng.random((2, 4, 4))])
    >>> A.shape, bool(np.allclose(A.to_dense()[1], np.kron(A.factors[0][1], A.factors[1][1])))
    ((2, 12, 12), True)
    """

    __slots__ = ("_factors",)
    representation = "kronecker"

    def __init__(self, factors: Sequence[Array]) -> None:
        factors = tuple(factors)
        if not factors:
            raise ValueError("factors must hold at least one (K, m_i, n_i) array")
        for i, f in enumerate(factors):
            check_array(f, f"factors[{i}]", (3,), ("(K, m_i, n_i)",))
            check_finite(f, f"factors[{i}]")
        members = {int(f.shape[0]) for f in factors}
        if len(members) != 1:
            raise ValueError(f"every factor must have the same number of members K, got {sorted(members)}")
        if len({of(f, f"factors[{i}]").name for i, f in enumerate(factors)}) != 1:
            raise TypeError("factors must all be NumPy arrays or all torch tensors")
        self._factors = factors

    @property
    def factors(self) -> tuple[Array, ...]:
        """The per-axis factors ``(K, m_i, n_i)``."""
        return self._factors

    @property
    def shape(self) -> tuple[int, ...]:
        f = self._factors
        return (
            int(f[0].shape[0]),
            math.prod(int(a.shape[1]) for a in f),
            math.prod(int(a.shape[2]) for a in f),
        )

    @property
    def backend(self) -> str:
        return of(self._factors[0]).name

    @property
    def dtype(self) -> Any:
        return self._factors[0].dtype

    @property
    def device(self) -> str:
        return device_of(self._factors[0])

    def to_dense(self) -> Array:
        out = self._factors[0]
        for f in self._factors[1:]:
            K, a, b = (int(s) for s in out.shape)
            out = einsum("kab,kcd->kacbd", out, f).reshape(K, a * int(f.shape[1]), b * int(f.shape[2]))
        return out

    def transpose(self) -> KroneckerBasis:
        return KroneckerBasis([f.swapaxes(-1, -2) for f in self._factors])

    def select(self, members: Sequence[int]) -> KroneckerBasis:
        index = list(members)
        if not index:
            raise ValueError("members must name at least one basis member")
        return KroneckerBasis([f[index] for f in self._factors])

    def to(self, device: Any = None, dtype: Any = None) -> KroneckerBasis:
        # Each factor moves as a dense basis of its own would (same rules and messages).
        return KroneckerBasis([DenseBasis.of_weights(f).to(device, dtype).to_dense() for f in self._factors])

    def _apply(self, s: Array) -> Array:
        r"""Member ``k`` applied to slice ``k`` of ``s`` (``(B, K, M, C)``), one axis at a time.

        Each axis is one batched GEMM over the members, :math:`A^{(i)\top}_k` times all the other
        indices at once (``(n_i, m_i) @ (m_i, R)``), rather than many tiny products.
        """
        B, K, _, C = (int(v) for v in s.shape)
        ins = [int(f.shape[1]) for f in self._factors]
        move = native(s).moveaxis  # NumPy and torch spell it alike (a hot path: no array API wrapper)
        t = move(s.reshape(B, K, *ins, C), 1, 0)  # (K, B, m_1, ..., m_d, C)
        for i, f in enumerate(self._factors):
            front = move(t, 2 + i, 1)  # (K, m_i, B, ..., C)
            rest = tuple(int(v) for v in front.shape[2:])
            out = f.swapaxes(1, 2) @ front.reshape(K, ins[i], -1)  # (K, n_i, R)
            t = move(out.reshape(K, int(f.shape[2]), *rest), 1, 2 + i)
        return move(t, 0, 1).reshape(B, K, self.N, C)

    def apply_each(self, x: Array) -> Array:
        B, M, C = (int(v) for v in x.shape)
        return self._apply(native(x).broadcast_to(x[:, None], (B, self.K, M, C)))

    def apply_members(self, s: Array, reduce: bool) -> Array:
        out = self._apply(s)
        return out.sum(1) if reduce else out

    def _flops(self, batch: int, channels: int) -> float:
        ins = [int(f.shape[1]) for f in self._factors]
        outs = [int(f.shape[2]) for f in self._factors]
        total = 0.0
        for i in range(len(ins)):
            size = math.prod(outs[:i]) * math.prod(ins[i + 1 :])
            total += 2.0 * batch * self.K * channels * size * ins[i] * outs[i]
        return total

    def cost_each(self, batch: int, channels: int) -> Cost:
        return Cost(self._flops(batch, channels), float(2 * batch * self.K * max(self.M, self.N) * channels))

    def cost_members(self, batch: int, channels: int, reduce: bool) -> Cost:
        out = batch * self.N * channels * (1 if reduce else self.K)
        return Cost(self._flops(batch, channels), float(batch * self.K * max(self.M, self.N) * channels + out))

    def __repr__(self) -> str:
        shapes = " ⊗ ".join(shape_str(tuple(f.shape[1:])) for f in self._factors)
        return f"KroneckerBasis(K={self.K}, {shapes}, backend={self.backend}, dtype={self.dtype})"
