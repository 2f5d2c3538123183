r"""Relative offsets on a grid, and relative-position attention with content (Cordonnier et al. Eq. 5).

:func:`relative_offsets` gives, for a grid and a boundary, the distinct offsets
:math:`\delta = \mathrm{pos}(m) - \mathrm{pos}(n)` and which one joins each pair of positions;
:class:`RelativeAttention` scores content and learned relative positions together.  The
position-only mechanisms are in :mod:`structconv.structures.positional`.

Both tables are pure functions of ``(grid, boundary)``, so they are cached by that value, and
their copies on a backend (a device, a dtype) by that value too (:func:`placed`): a cache that
can never go stale, whatever objects are freed and rebuilt in between.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import numpy as np

from ..backend import Array, dtype_name, einsum, namespace, of, shape_str
from ..backend.checks import check_array
from ..bases.grid import BOUNDARIES, _grid
from .attention import Mechanism

#: How many placed tables :func:`placed` keeps (the oldest goes first).
_PLACED_SIZE = 256


@dataclass(frozen=True)
class RelativeOffsets:
    """The distinct offsets of a grid and, for every pair ``(m, n)``, which one joins them.

    Attributes
    ----------
    offsets
        ``(O, d)`` integer offsets, row-major over the per-axis ranges.
    index
        ``(M, N)``: the offset id of :math:`\\mathrm{pos}(m) - \\mathrm{pos}(n)`.
    axis_index
        ``(d, M, N)``: per axis, the position of :math:`\\delta_i` in that axis's range.
    lows, lengths
        Per axis, the smallest offset and the number of offsets.
    """

    grid: tuple[int, ...]
    boundary: str
    offsets: np.ndarray = field(repr=False)
    index: np.ndarray = field(repr=False)
    axis_index: np.ndarray = field(repr=False)
    lows: tuple[int, ...]
    lengths: tuple[int, ...]

    def index_like(self, like: Array) -> Any:
        """:attr:`index` as an integer array on the backend and device of ``like`` (see :func:`placed`).

        Parameters
        ----------
        like
            An array of the backend and device wanted.
        """
        return placed(self, "index", like)


_RELATIVE: dict[tuple[tuple[int, ...], str], RelativeOffsets] = {}


def relative_offsets(grid: tuple[int, ...], boundary: str = "zero") -> RelativeOffsets:
    r"""The :class:`RelativeOffsets` of ``grid`` under ``boundary`` (cached by value).

    Parameters
    ----------
    grid
        Grid sizes :math:`(S_1, \dots, S_d)`.
    boundary
        ``"zero"``: offsets :math:`\delta_i \in [-(S_i - 1), S_i - 1]`; ``"periodic"``: offsets
        taken modulo :math:`S_i`, in :math:`[-\lfloor S_i/2 \rfloor, \lceil S_i/2 \rceil - 1]`.

    Returns
    -------
    RelativeOffsets
        Read-only tables, shared by every caller of the same ``(grid, boundary)``.

    Raises
    ------
    ValueError
        For a bad grid or boundary, or tables larger than half the host's memory.
    """
    # A plain dictionary, not functools.lru_cache: torch.compile honours a dictionary lookup (and
    # guards on it) but traces through an lru_cache into the NumPy construction below.
    key = (tuple(grid), boundary)
    cached = _RELATIVE.get(key)
    if cached is None:
        cached = _RELATIVE[key] = _relative_offsets(*key)
    return cached


def _relative_offsets(grid: tuple[int, ...], boundary: str) -> RelativeOffsets:
    g = _grid(grid)
    if boundary not in BOUNDARIES:
        raise ValueError(f"boundary must be one of {BOUNDARIES}, got {boundary!r}")
    size = np.asarray(g)
    periodic = boundary == "periodic"
    lows = tuple(int(v) for v in (-(size // 2) if periodic else -(size - 1)))
    lengths = tuple(int(v) for v in (size if periodic else 2 * size - 1))
    positions = math.prod(g)
    # delta, axis_index and index: (2d + 1) int64 entries per pair of positions, all built at once.
    need = positions**2 * (2 * len(g) + 1) * 8
    host = np.empty(0)
    budget = of(host).memory_capacity(host) / 2
    if need > budget:
        raise ValueError(
            f"grid {g} has {positions:,} positions; its relative-offset tables would need {need / 2**30:.3g} GiB, "
            f"more than half of this host's {2 * budget / 2**30:.3g} GiB"
        )
    pos = np.stack(np.meshgrid(*[np.arange(s) for s in g], indexing="ij"), -1).reshape(-1, len(g))
    delta = pos[:, None, :] - pos[None, :, :]
    if periodic:
        delta = (delta + size // 2) % size - size // 2
    axis_index = np.moveaxis(delta - np.asarray(lows), -1, 0).astype(np.int64)
    index = np.ravel_multi_index(tuple(axis_index), lengths).astype(np.int64)
    axes = [np.arange(lo, lo + n) for lo, n in zip(lows, lengths, strict=True)]
    offsets = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(g)).astype(np.int64)
    for a in (offsets, index, axis_index):
        a.setflags(write=False)
    return RelativeOffsets(g, boundary, offsets, index, axis_index, lows, lengths)


_PLACED: dict[tuple[Any, ...], Any] = {}


def _table(rel: RelativeOffsets, name: str) -> tuple[np.ndarray, str | None]:
    """The NumPy table ``name`` of ``rel`` and its dtype on a backend (``None``: the dtype of ``like``)."""
    # Copies: the cached tables are read-only, and torch does not share read-only memory.
    if name == "index":
        return rel.index.copy(), "int64"
    if name == "offsets":
        return rel.offsets.astype(np.float64), None
    if name.startswith("axis_index_t"):  # (N, M) per axis: the gather index of RelativeAttention
        return np.ascontiguousarray(rel.axis_index[int(name.removeprefix("axis_index_t"))].T), "int64"
    raise KeyError(name)


def placed(rel: RelativeOffsets, name: str, like: Array) -> Any:
    """Table ``name`` of ``rel`` on ``like``'s backend and device.

    Cached by value (grid, boundary, table, backend, dtype, device), so a forward pass copies no
    table to its device; a plain dictionary, not ``functools.lru_cache``: ``torch.compile``
    honours a dictionary lookup (and guards on it) but traces through an ``lru_cache``.

    Parameters
    ----------
    rel
        The tables of a grid (:func:`relative_offsets`).
    name
        ``"index"`` (:attr:`RelativeOffsets.index`), ``"offsets"`` or ``"axis_index_t<i>"``
        (axis ``i`` of :attr:`RelativeOffsets.axis_index`, transposed to ``(N, M)``).
    like
        An array of the backend, device (and, for ``"offsets"``, dtype) wanted.

    Returns
    -------
    Array
        The table: int64, except ``"offsets"`` in ``like``'s dtype.  Shared: read-only by
        convention.
    """
    backend = of(like)
    key = (rel.grid, rel.boundary, name, backend.name, dtype_name(like), backend.device(like))
    found = _PLACED.get(key)
    if found is None:
        if len(_PLACED) >= _PLACED_SIZE:
            _PLACED.pop(next(iter(_PLACED)))  # the oldest
        values, dtype = _table(rel, name)
        found = _PLACED[key] = backend.asarray(values, like, dtype)
    return found


def _check_tables(tables: Sequence[Array], rel: RelativeOffsets) -> tuple[int, ...]:
    if len(tables) != len(rel.grid):
        raise ValueError(f"give one table per grid axis: {len(rel.grid)} tables, got {len(tables)}")
    widths = []
    for i, (t, length) in enumerate(zip(tables, rel.lengths, strict=True)):
        check_array(t, f"tables[{i}]", (2,), ("(L, D_i)",))
        if int(t.shape[0]) != length:
            raise ValueError(
                f"tables[{i}] must have {length} rows (the {rel.boundary} offsets of an axis of "
                f"{rel.grid[i]}), got {shape_str(tuple(t.shape))}"
            )
        widths.append(int(t.shape[1]))
    return tuple(widths)


def _axis_sum(per_axis: Sequence[Array], lengths: tuple[int, ...]) -> Array:
    """``(K, L_1) ... (K, L_d)`` -> ``(K, O)``: the sum over axes at every offset (row-major)."""
    d = len(per_axis)
    total = None
    for i, s in enumerate(per_axis):
        shape = [int(s.shape[0])] + [lengths[j] if j == i else 1 for j in range(d)]
        term = s.reshape(shape)
        total = term if total is None else total + term
    assert total is not None
    return total.reshape(int(total.shape[0]), -1)


def _split(a: Array, widths: tuple[int, ...], axis: int) -> list[Array]:
    out, start = [], 0
    for w in widths:
        index = [slice(None)] * a.ndim
        index[axis] = slice(start, start + w)
        out.append(a[tuple(index)])
        start += w
    return out


@dataclass(frozen=True, eq=False)
class RelativeAttention(Mechanism):
    r"""Content and learned relative position together: the four terms of Eq. 5.

    With keys :math:`k_m = x_m W^k_h` and queries :math:`q_n = z_n W^q_h` (``key``/``query``,
    ``(K, P, D)``), the projected embedding :math:`\hat r_\delta = \hat W_h^\top r_\delta`
    (``rel_key``, ``(K, D_p, D)``, with :math:`r_\delta` from per-axis ``tables`` as in
    :class:`LearnedPosition`), and the vectors ``u`` and ``v`` (``(K, D)``):

    .. math:: a_{hmn} = \mathrm{scale}\,\big(q_n\cdot k_m + q_n\cdot\hat r_{\delta_{mn}} + u_h\cdot k_m
              + v_h\cdot\hat r_{\delta_{mn}}\big).

    A term is present when its parameters are given (``key`` and ``query``; ``query`` and
    ``rel_key``; ``key`` and ``u``; ``rel_key`` and ``v``).  The query-position term is computed
    per axis against the :math:`L_i` offsets of the axis and gathered, never through an
    ``(M, N, D)`` tensor of embeddings.

    Parameters
    ----------
    grid
        Grid sizes :math:`(S_1, \dots, S_d)`; the tokens are its positions, row-major.
    tables
        One ``(L_i, D_i)`` table per axis, :math:`L_i` the axis' offsets under ``boundary``
        (:attr:`RelativeOffsets.lengths`).
    key, query
        :math:`W^k` and :math:`W^q`, ``(K, P, D)`` each.
    rel_key
        :math:`\hat W`, ``(K, D_p, D)`` with :math:`D_p = \sum_i D_i`.
    u, v
        ``(K, D)`` each.
    boundary
        ``"zero"`` or ``"periodic"`` (offsets wrap around the grid).
    scale
        The factor of the scores, e.g. :math:`1/\sqrt D`.

    Everything after ``tables`` is a keyword.
    """

    grid: tuple[int, ...]
    tables: tuple[Array, ...]
    _: KW_ONLY
    key: Array | None = None
    query: Array | None = None
    rel_key: Array | None = None
    u: Array | None = None
    v: Array | None = None
    boundary: str = "zero"
    scale: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "grid", _grid(self.grid))
        object.__setattr__(self, "tables", tuple(self.tables))
        widths = _check_tables(self.tables, relative_offsets(self.grid, self.boundary))
        terms = self._terms()
        if not any(terms):
            raise ValueError("RelativeAttention needs one of: key+query, query+rel_key, key+u, rel_key+v")
        named = (("key", self.key), ("query", self.query), ("rel_key", self.rel_key))
        given = {n: a for n, a in named if a is not None}
        for name, a in given.items():
            check_array(a, name, (3,), (f"(K, {'D_p' if name == 'rel_key' else 'P'}, D)",))
        dims = {(int(a.shape[0]), int(a.shape[2])) for a in given.values()}
        for name, a in (("u", self.u), ("v", self.v)):
            if a is not None:
                check_array(a, name, (2,), ("(K, D)",))
                dims.add((int(a.shape[0]), int(a.shape[1])))
        if len(dims) != 1:
            raise ValueError(f"key, query, rel_key, u and v must share (K, D), got {sorted(dims)}")
        if self.rel_key is not None and int(self.rel_key.shape[1]) != sum(widths):
            raise ValueError(
                f"rel_key must have shape (K, D_p, D) with D_p = {sum(widths)} (the tables' widths), "
                f"got {shape_str(tuple(self.rel_key.shape))}"
            )

    def _terms(self) -> tuple[bool, bool, bool, bool]:
        k, q, r = self.key is not None, self.query is not None, self.rel_key is not None
        return k and q, q and r, k and self.u is not None, r and self.v is not None

    @property
    def heads(self) -> int:
        for a in (self.key, self.query, self.rel_key, self.u, self.v):
            if a is not None:
                return int(a.shape[0])
        raise AssertionError("unreachable: __post_init__ requires a term")

    @property
    def relative(self) -> RelativeOffsets:
        return relative_offsets(self.grid, self.boundary)

    def _projected_tables(self) -> list[Array]:
        """Per axis :math:`\\hat W_h^{(i)\\top} r^{(i)}`, ``(K, L_i, D)``."""
        assert self.rel_key is not None
        widths = tuple(int(t.shape[1]) for t in self.tables)
        parts = _split(self.rel_key, widths, 1)
        return [einsum("le,ked->kld", t, w) for t, w in zip(self.tables, parts, strict=True)]

    def scores(self, x: Array, z: Array) -> Array:
        rel = self.relative
        M, N = rel.index.shape
        if int(x.shape[1]) != M or int(z.shape[1]) != N:
            raise ValueError(
                f"RelativeAttention on the grid {self.grid} needs {M} positions, got x with "
                f"{int(x.shape[1])} and z with {int(z.shape[1])}"
            )
        content, query_pos, key_bias, position = self._terms()
        keys = einsum("bmp,kpd->bkmd", x, self.key) if self.key is not None else None
        queries = einsum("bnp,kpd->bknd", z, self.query) if self.query is not None else None
        B, K = int(x.shape[0]), self.heads
        total: Any = 0.0
        if content:
            assert keys is not None and queries is not None
            total = total + keys @ queries.swapaxes(-1, -2)
        if key_bias:
            total = total + einsum("bkmd,kd->bkm", keys, self.u)[..., None]
        if query_pos or position:
            projected = self._projected_tables()
        if query_pos:
            xp = namespace(x)
            for i, table in enumerate(projected):
                per_offset = einsum("bknd,kld->bknl", queries, table)  # (B, K, N, L_i)
                idx = placed(rel, f"axis_index_t{i}", per_offset)  # (N, M)
                gathered = xp.take_along_axis(per_offset, xp.broadcast_to(idx, (B, K, N, M)), axis=-1)
                total = total + gathered.swapaxes(-1, -2)
        if position:
            per_axis = [einsum("kld,kd->kl", t, self.v) for t in projected]
            offset_scores = _axis_sum(per_axis, rel.lengths)
            total = total + offset_scores[:, rel.index_like(offset_scores)][None]
        return total * self.scale if self.scale != 1.0 else total
