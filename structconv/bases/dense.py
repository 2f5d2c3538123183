r"""Dense bases: the whole :math:`(K, M, N)` tensor is stored.

Good for tiny structures, tests and the decomposition of Proposition 1.  Dense operands are
contracted by opt_einsum along an explicit path chosen by the engine.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ..backend import Array, einsum, of
from ..backend.checks import check_array, check_finite
from .base import Cost, _member_list, _PlacedByArray


class DenseBasis(_PlacedByArray):
    """A basis stored as a dense array of shape ``(K, M, N)`` or ``(B, K, M, N)``.

    Parameters
    ----------
    array
        The basis weights: a floating NumPy array or torch tensor (it may require grad).

    Examples
    --------
    >>> import numpy as np
    >>> from structconv import DenseBasis
    >>> A = DenseBasis(np.eye(3)[None])
    >>> A.shape, A.representation
    ((1, 3, 3), 'dense')
    """

    __slots__ = ("_array",)
    representation = "dense"

    def __init__(self, array: Array) -> None:
        check_array(array, "basis", (3, 4), ("(K, M, N)", "(B, K, M, N)"))
        check_finite(array, "basis")
        self._array = array

    @classmethod
    def of_weights(cls, array: Array) -> DenseBasis:
        """Wrap weights the library has just computed (a softmax of finite scores), skipping the checks.

        The finiteness check reads every entry back, which on a GPU stalls the host once per
        layer and step; a softmax whose scores are finite is finite by construction.

        Parameters
        ----------
        array
            Finite floating weights ``(K, M, N)`` or ``(B, K, M, N)``.
        """
        basis = cls.__new__(cls)
        basis._array = array
        return basis

    @property
    def array(self) -> Array:
        """The stored dense array (read-only by convention)."""
        return self._array

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self._array.shape)

    def _placed(self) -> Array:
        return self._array

    def to_dense(self) -> Array:
        return self._array

    @property
    def instance_rows(self) -> bool:
        """Whether a per-instance basis is stored in ``(B, M, K, N)`` memory order, each instance ``(M K, N)``.

        :class:`~structconv.nn.PositionalAttention` stores its heads dropped out per image so; the
        x·Θ-first order then reads them without a copy.
        """
        a = self._array
        if a.ndim != 4:
            return False
        _, K, M, N = self.shape
        strides = of(a).strides(a)
        return (K == 1 or strides[1] == N) and (M == 1 or strides[2] == K * N) and (N == 1 or strides[3] == 1)

    def plan_key(self) -> tuple[Any, ...]:
        # The memory order decides which order copies the basis (DenseOrder.cost).
        return (type(self).__name__, self.shape, self.instance_rows)

    def transpose(self) -> DenseBasis:
        return DenseBasis.of_weights(self._array.swapaxes(-1, -2))  # the same (checked) entries

    def select(self, members: Sequence[int]) -> DenseBasis:
        index = _member_list(members)
        a = self._array
        return DenseBasis(a[:, index] if a.ndim == 4 else a[index])

    def to(self, device: Any = None, dtype: Any = None) -> DenseBasis:
        # The entries were checked when the basis was built; checking them again would stall a
        # GPU on every autocast call (the engine casts the basis there).
        return DenseBasis.of_weights(of(self._array).move(self._array, device, dtype, what="basis"))

    def _equation(self, rhs: str) -> str:
        lhs = "bkmn" if self.batch is not None else "kmn"
        return f"{lhs},{rhs}"

    def apply_each(self, x: Array) -> Array:
        return einsum(self._equation("bmc->bknc"), self._array, x)

    def apply_members(self, s: Array, *, reduce: bool) -> Array:
        out = "bnc" if reduce else "bknc"
        return einsum(self._equation(f"bkmc->{out}"), self._array, s)

    def _size(self) -> float:
        return float(math.prod(self.shape))

    def cost_each(self, batch: int, channels: int) -> Cost:
        per_instance = 1 if self.batch is not None else batch
        return Cost(2.0 * self._size() * per_instance * channels, float(batch * self.K * self.N * channels))

    def cost_members(self, batch: int, channels: int, *, reduce: bool) -> Cost:
        per_instance = 1 if self.batch is not None else batch
        out = batch * self.N * channels * (1 if reduce else self.K)
        return Cost(2.0 * self._size() * per_instance * channels, float(out))
