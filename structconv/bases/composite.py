r"""Bases built from other bases without materialising them.

* :class:`ConcatBasis` stacks members of bases of any representations (more heads),
* :class:`ComposedBasis` is the basis of Proposition 3, :math:`A_{(k',k'')} = A'_{k'} A''_{k''}`,
  applied as two successive applications (never forming the products),
* :class:`SelectBasis` restricts any basis to some of its members.

They only use the hooks of their parts, which is what makes a representation pluggable.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ..backend import Array, concatenate, einsum, zeros
from .base import Basis, Cost, _member_list
from .convert import as_basis
from .dense import DenseBasis
from .sparse import SparseBasis


def _check_compatible(parts: Sequence[Basis], what: str) -> None:
    first = parts[0]
    for i, p in enumerate(parts[1:], start=1):
        if p.shape[:-3] != first.shape[:-3] or p.shape[-2:] != first.shape[-2:]:
            raise ValueError(
                f"{what}: basis {i} has shape {p.shape} but basis 0 has shape {first.shape}; batch, M and N must agree"
            )
        if p.backend != first.backend or str(p.dtype) != str(first.dtype) or p.device != first.device:
            raise TypeError(
                f"{what}: basis {i} is {p.backend}/{p.dtype}/{p.device} but basis 0 is "
                f"{first.backend}/{first.dtype}/{first.device}"
            )


class _Derived(Basis):
    """Shared plumbing of bases defined from other bases."""

    __slots__ = ()

    @property
    def _parts(self) -> tuple[Basis, ...]:
        raise NotImplementedError

    @property
    def backend(self) -> str:
        return self._parts[0].backend

    @property
    def dtype(self) -> Any:
        return self._parts[0].dtype

    @property
    def device(self) -> str:
        return self._parts[0].device

    def plan_key(self) -> tuple[Any, ...]:
        return (type(self).__name__, self.shape, tuple(p.plan_key() for p in self._parts))

    @property
    def host_orders(self) -> frozenset[str]:  # type: ignore[override]
        return frozenset().union(*(p.host_orders for p in self._parts))

    def select(self, members: Sequence[int]) -> Basis:
        return SelectBasis(self, members)


class ConcatBasis(_Derived):
    """Members of several bases side by side: ``K = sum(K_i)``.

    Use :func:`concat`, which keeps dense and sparse bases in their own representation.

    Parameters
    ----------
    parts
        At least one basis; all share the batch, ``M``, ``N``, backend, dtype and device.
    """

    __slots__ = ("parts",)
    representation = "concat"

    def __init__(self, parts: Sequence[Basis]) -> None:
        if not parts:
            raise ValueError("bases must hold at least one basis")
        _check_compatible(parts, "concat")
        self.parts = tuple(parts)

    @property
    def _parts(self) -> tuple[Basis, ...]:
        return self.parts

    @property
    def shape(self) -> tuple[int, ...]:
        first = self.parts[0].shape
        return first[:-3] + (sum(p.K for p in self.parts),) + first[-2:]

    def to_dense(self) -> Array:
        return concatenate([p.to_dense() for p in self.parts], axis=len(self.shape) - 3)

    def transpose(self) -> Basis:
        return ConcatBasis([p.transpose() for p in self.parts])

    def to(self, device: Any = None, dtype: Any = None) -> Basis:
        return ConcatBasis([p.to(device, dtype) for p in self.parts])

    def energy(self) -> float:
        return sum(p.energy() for p in self.parts)

    def _split(self, a: Array) -> list[Array]:
        out, start = [], 0
        for p in self.parts:
            out.append(a[:, start : start + p.K])
            start += p.K
        return out

    def apply_each(self, x: Array) -> Array:
        return concatenate([p.apply_each(x) for p in self.parts], axis=1)

    def apply_members(self, s: Array, *, reduce: bool) -> Array:
        outs = [p.apply_members(si, reduce=reduce) for p, si in zip(self.parts, self._split(s), strict=True)]
        return sum(outs[1:], outs[0]) if reduce else concatenate(outs, axis=1)

    def apply_combined(self, x: Array, theta: Array) -> Array:
        ys, start = [], 0
        for p in self.parts:
            ys.append(p.apply_combined(x, theta[start : start + p.K]))
            start += p.K
        return sum(ys[1:], ys[0])

    def cost_build(self) -> Cost:
        return sum((p.cost_build() for p in self.parts), Cost())

    def cost_each(self, batch: int, channels: int) -> Cost:
        return sum((p.cost_each(batch, channels) for p in self.parts), Cost())

    def cost_members(self, batch: int, channels: int, *, reduce: bool) -> Cost:
        return sum((p.cost_members(batch, channels, reduce=reduce) for p in self.parts), Cost())

    def cost_combined(self, batch: int, p: int, q: int) -> Cost:
        return sum((b.cost_combined(batch, p, q) for b in self.parts), Cost())


class SelectBasis(_Derived):
    """Members ``members`` of ``parent``, for representations that cannot select natively.

    Parameters
    ----------
    parent
        The basis selected from.
    members
        Member indices in ``[0, K)``, at least one, in the order wanted.
    """

    __slots__ = ("members", "parent")
    representation = "select"

    def __init__(self, parent: Basis, members: Sequence[int]) -> None:
        members = [int(k) for k in _member_list(members)]
        bad = [k for k in members if not 0 <= k < parent.K]
        if bad:
            raise IndexError(f"members {bad} are out of range for a basis with K={parent.K}")
        self.parent = parent
        self.members = tuple(members)

    @property
    def _parts(self) -> tuple[Basis, ...]:
        return (self.parent,)

    @property
    def shape(self) -> tuple[int, ...]:
        s = self.parent.shape
        return s[:-3] + (len(self.members),) + s[-2:]

    def to_dense(self) -> Array:
        dense = self.parent.to_dense()
        return dense[:, list(self.members)] if self.batch is not None else dense[list(self.members)]

    def transpose(self) -> Basis:
        return SelectBasis(self.parent.transpose(), self.members)

    def to(self, device: Any = None, dtype: Any = None) -> Basis:
        return SelectBasis(self.parent.to(device, dtype), self.members)

    def apply_each(self, x: Array) -> Array:
        return self.parent.apply_each(x)[:, list(self.members)]

    def apply_members(self, s: Array, *, reduce: bool) -> Array:
        if len(set(self.members)) != len(self.members):
            return self._apply_repeated(s, reduce=reduce)
        # The parent's members that are not selected read a slice of zeros: the slices of s and
        # one zero slice, gathered in the parent's order (no array is written in place).
        slot = {k: i for i, k in enumerate(self.members)}
        padded = concatenate([s, zeros((s.shape[0], 1) + tuple(s.shape[2:]), like=s)], axis=1)
        full = padded[:, [slot.get(k, len(self.members)) for k in range(self.parent.K)]]
        out = self.parent.apply_members(full, reduce=reduce)
        return out if reduce else out[:, list(self.members)]

    def _apply_repeated(self, s: Array, *, reduce: bool) -> Array:
        """A selection that repeats members, as rounds that each select a member once.

        Round :math:`r` holds the :math:`r`-th occurrence of every member; each round is a
        selection without repeats, and the rounds' results are summed or put back in place.
        """
        rounds: list[list[int]] = []
        seen: dict[int, int] = {}
        for i, k in enumerate(self.members):
            r = seen.get(k, 0)
            seen[k] = r + 1
            if r == len(rounds):
                rounds.append([])
            rounds[r].append(i)
        parts = [
            SelectBasis(self.parent, [self.members[i] for i in rnd]).apply_members(s[:, rnd], reduce=reduce)
            for rnd in rounds
        ]
        if reduce:
            return sum(parts[1:], parts[0])
        position = [i for rnd in rounds for i in rnd]
        back = sorted(range(len(position)), key=position.__getitem__)  # where each selected member landed
        return concatenate(parts, axis=1)[:, back]

    def cost_each(self, batch: int, channels: int) -> Cost:
        return self.parent.cost_each(batch, channels)

    def cost_members(self, batch: int, channels: int, *, reduce: bool) -> Cost:
        return self.parent.cost_members(batch, channels, reduce=reduce)


class ComposedBasis(_Derived):
    r"""The basis of Proposition 3: :math:`A_{k'K''+k''} = A'_{k'} A''_{k''}` (row-major pairs).

    Shape ``(K'K'', M', N'')``.  Applying it applies :math:`A'` then :math:`A''`, so the cost is
    that of the two factors and the :math:`K'K''` products are never formed.  Only bases shared
    by the whole batch (no batch axis) are composed lazily; :func:`structconv.compose` builds
    per-instance compositions explicitly.

    Parameters
    ----------
    first
        :math:`\mathbf A'`, ``(K', M', N')``, applied first.
    second
        :math:`\mathbf A''`, ``(K'', N', N'')``, placed like ``first``.
    """

    __slots__ = ("first", "second")
    representation = "composed"

    def __init__(self, first: Basis, second: Basis) -> None:
        if first.batch is not None or second.batch is not None:
            raise ValueError("ComposedBasis composes bases without a batch axis; use structconv.compose")
        if first.N != second.M:
            raise ValueError(f"cannot compose: first basis has N={first.N} outputs but second has M={second.M} inputs")
        _check_compatible_placement(first, second)
        self.first = first
        self.second = second

    @property
    def _parts(self) -> tuple[Basis, ...]:
        return (self.first, self.second)

    @property
    def shape(self) -> tuple[int, ...]:
        return (self.first.K * self.second.K, self.first.M, self.second.N)

    def to_dense(self) -> Array:
        a, b = self.first.to_dense(), self.second.to_dense()
        prod = einsum("kmj,ljn->klmn", a, b)
        return prod.reshape(self.shape)

    def transpose(self) -> Basis:
        k1, k2 = self.first.K, self.second.K
        swapped = ComposedBasis(self.second.transpose(), self.first.transpose())
        return SelectBasis(swapped, [b * k1 + a for a in range(k1) for b in range(k2)])

    def to(self, device: Any = None, dtype: Any = None) -> Basis:
        return ComposedBasis(self.first.to(device, dtype), self.second.to(device, dtype))

    def apply_each(self, x: Array) -> Array:
        B, _, C = x.shape
        k1, k2 = self.first.K, self.second.K
        r1 = self.first.apply_each(x).reshape(B * k1, self.first.N, C)
        return self.second.apply_each(r1).reshape(B, k1 * k2, self.N, C)

    def apply_members(self, s: Array, *, reduce: bool) -> Array:
        B, _, M, C = s.shape
        k1, k2 = self.first.K, self.second.K
        n1 = self.first.N
        s = s.reshape(B, k1, k2, M, C).swapaxes(1, 2).reshape(B * k2, k1, M, C)
        h = self.first.apply_members(s, reduce=False)
        h = h.reshape(B, k2, k1, n1, C).swapaxes(1, 2).reshape(B * k1, k2, n1, C)
        out = self.second.apply_members(h, reduce=reduce)
        if reduce:
            return out.reshape(B, k1, self.N, C).sum(1)
        return out.reshape(B, k1 * k2, self.N, C)

    def cost_each(self, batch: int, channels: int) -> Cost:
        return self.first.cost_each(batch, channels) + self.second.cost_each(batch * self.first.K, channels)

    def cost_members(self, batch: int, channels: int, *, reduce: bool) -> Cost:
        k1, k2 = self.first.K, self.second.K
        shuffle = Cost(0.0, float(batch * k1 * k2 * (self.M + self.first.N) * channels))
        return (
            self.first.cost_members(batch * k2, channels, reduce=False)
            + self.second.cost_members(batch * k1, channels, reduce=reduce)
            + shuffle
        )


def _check_compatible_placement(a: Basis, b: Basis) -> None:
    if a.backend != b.backend or str(a.dtype) != str(b.dtype) or a.device != b.device:
        raise TypeError(
            f"cannot combine a {a.backend}/{a.dtype}/{a.device} basis with a {b.backend}/{b.dtype}/{b.device} one"
        )


def concat(bases: Sequence[Basis | Array]) -> Basis:
    """Concatenate the members of several bases (e.g. to add heads).

    Dense bases stay dense, sparse bases stay sparse, mixed representations give a
    :class:`ConcatBasis`.

    Parameters
    ----------
    bases
        At least one basis (or array, read by :func:`~structconv.as_basis`); all share the batch,
        ``M``, ``N``, backend, dtype and device.

    Returns
    -------
    Basis
        ``K = sum(K_i)`` members, those of ``bases[0]`` first.

    Examples
    --------
    >>> import numpy as np
    >>> from structconv import DenseBasis, concat
    >>> concat([DenseBasis(np.ones((2, 3, 4))), DenseBasis(np.ones((1, 3, 4)))]).shape
    (3, 3, 4)
    """
    parts: list[Basis] = []
    for b in bases:
        b = as_basis(b)
        parts.extend(b.parts if isinstance(b, ConcatBasis) else [b])
    if not parts:
        raise ValueError("bases must hold at least one basis")
    _check_compatible(parts, "concat")
    if len(parts) == 1:
        return parts[0]
    axis = len(parts[0].shape) - 3
    if all(isinstance(p, DenseBasis) for p in parts):
        return DenseBasis(concatenate([p.to_dense() for p in parts], axis=axis))
    if all(isinstance(p, SparseBasis) for p in parts):
        sparse = [p for p in parts if isinstance(p, SparseBasis)]
        idx, offset = [], 0
        for p in sparse:
            # The entries as stored, members renumbered by offset: no sort (a host round trip on a
            # GPU), since repeated entries add up in every product anyway; checked when stored.
            i = p._indices
            idx.append(concatenate([i[:axis], i[axis : axis + 1] + offset, i[axis + 1 :]], 0))
            offset += p.K
        shape = parts[0].shape[:-3] + (offset,) + parts[0].shape[-2:]
        return SparseBasis._from_checked(concatenate(idx, 1), concatenate([p._values for p in sparse], 0), shape)
    return ConcatBasis(parts)
