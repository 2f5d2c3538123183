r"""Relative offsets on a grid: its distinct offsets :math:`\delta = \mathrm{pos}(m) - \mathrm{pos}(n)`, per axis.

:func:`relative_offsets` and its copies on a backend (:func:`table_on`) are cached by value, so
they never go stale.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np

from ..backend import Array, dtype_name, of, shape_str
from ..backend.cache import BoundedCache
from ..backend.checks import check_array, check_memory
from ..bases.grid_args import _check_boundary, _grid


@dataclass(frozen=True)
class RelativeOffsets:
    r"""The distinct offsets of a grid, and per axis which one joins two coordinates (:math:`O(S_i)` numbers).

    Attributes
    ----------
    grid, boundary
        The grid's sizes :math:`(S_1, \dots, S_d)` and ``"zero"`` or ``"periodic"``.
    lows, lengths
        Per axis, the smallest offset and the number :math:`L_i` of offsets.
    axis_ids
        Per axis, ``(2 S_i - 1,)`` int64: the position in its range of :math:`j - (S_i - 1)` (wrapped on a torus).
    """

    grid: tuple[int, ...]
    boundary: str
    lows: tuple[int, ...]
    lengths: tuple[int, ...]
    axis_ids: tuple[np.ndarray, ...] = field(repr=False)

    @cached_property
    def offsets(self) -> np.ndarray:
        r"""``(O, d)`` integer offsets, row-major over the axes' ranges, :math:`O = \prod_i L_i`, built when used."""
        check_host_memory(self.grid, "its table of offsets", math.prod(self.lengths) * len(self.grid) * 8)
        axes = [np.arange(lo, lo + n, dtype=np.int64) for lo, n in zip(self.lows, self.lengths, strict=True)]
        table = np.stack(np.meshgrid(*axes, indexing="ij"), -1).reshape(-1, len(self.grid))
        table.setflags(write=False)
        return table

    @property
    def positions(self) -> int:
        r""":math:`M = \prod_i S_i`."""
        return math.prod(self.grid)

    def axis_index(self, i: int) -> np.ndarray:
        """``(S_i, S_i)``: along axis ``i``, the position in the axis's range of :math:`m_i - n_i` (built now)."""
        size = self.grid[i]
        return np.asarray(self.axis_ids[i][np.subtract.outer(np.arange(size), np.arange(size)) + size - 1])

    def gather(self, scores: Array) -> Array:
        """Per-offset ``scores`` ``(..., O)`` at every pair of positions, ``(..., M, N)``, by per-axis indices."""
        lead = tuple(int(v) for v in scores.shape[:-1])
        d = len(self.grid)
        if int(scores.shape[-1]) != math.prod(self.lengths):
            raise ValueError(
                f"scores must have {math.prod(self.lengths)} offsets of the grid {self.grid} on its last axis, "
                f"got {shape_str(tuple(scores.shape))}"
            )
        check_host_memory(self.grid, "dense scores of every pair", self.positions**2 * max(1, math.prod(lead)) * 8)
        per_axis = scores.reshape(*lead, *self.lengths)
        index = []
        for i in range(d):
            table = table_on(self, f"axis_index{i}", scores)
            index.append(table.reshape([self.grid[i] if j in (i, d + i) else 1 for j in range(2 * d)]))
        out = per_axis[(Ellipsis, *index)]  # (..., S_1..S_d [keys], S_1..S_d [queries])
        return out.reshape(*lead, self.positions, self.positions)


_HOST = np.empty(0)  # the host's memory is what the NumPy tables take


def check_host_memory(grid: tuple[int, ...], what: str, need: float) -> None:
    """Refuse ``what`` for ``grid``, ``need`` bytes, beyond half the host's memory, before allocating it."""
    positions = f"grid {grid} has {math.prod(grid):,} positions; {what}"
    check_memory(need, _HOST, positions, share=0.5)


def check_positions(rel: RelativeOffsets, x: Array, z: Array, who: str) -> None:
    """Refuse keys ``x`` or queries ``z`` ``(B, ·, P)`` that are not the grid's positions."""
    M = rel.positions
    if int(x.shape[1]) != M or int(z.shape[1]) != M:
        raise ValueError(
            f"{who} on the grid {rel.grid} needs {M} positions, "
            f"got x with {int(x.shape[1])} and z with {int(z.shape[1])}"
        )


#: The tables of the 64 grids used last (:func:`relative_offsets`).
_RELATIVE: BoundedCache[RelativeOffsets] = BoundedCache(size=64)


def relative_offsets(grid: tuple[int, ...], boundary: str = "zero") -> RelativeOffsets:
    r"""The :class:`RelativeOffsets` of ``grid`` under ``boundary``, shared, read-only (the last 64 grids kept).

    ``"zero"``: offsets :math:`\delta_i \in [-(S_i - 1), S_i - 1]`; ``"periodic"``: modulo :math:`S_i`,
    in :math:`[-\lfloor S_i/2 \rfloor, \lceil S_i/2 \rceil - 1]`.
    """
    key = (tuple(grid), boundary)
    return _RELATIVE.find(key) or _RELATIVE.put(key, _relative_offsets(*key))


def _relative_offsets(grid: tuple[int, ...], boundary: str) -> RelativeOffsets:
    g = _grid(grid)
    _check_boundary(boundary)
    periodic = boundary == "periodic"
    lows = tuple(-(s // 2) if periodic else -(s - 1) for s in g)
    lengths = tuple(s if periodic else 2 * s - 1 for s in g)
    axis_ids = []
    for s, low in zip(g, lows, strict=True):
        delta = np.arange(-(s - 1), s, dtype=np.int64)
        if periodic:
            delta = (delta + s // 2) % s - s // 2
        axis_ids.append(delta - low)
        axis_ids[-1].setflags(write=False)
    return RelativeOffsets(g, boundary, lows, lengths, tuple(axis_ids))


#: The 256 tables placed last on a backend, dtype and device (:func:`table_on`).
_PLACED: BoundedCache[Any] = BoundedCache(size=256)


def table_on(rel: RelativeOffsets, name: str, like: Array) -> Any:
    """Table ``name`` of ``rel`` on ``like``'s backend and device, cached by value (no copy per forward pass).

    ``name`` is ``"offsets"`` (in ``like``'s dtype), ``"axis_index<i>"`` (int64, ``(S_i, S_i)``,
    :meth:`RelativeOffsets.axis_index`) or ``"axis_offsets<i>"`` (in ``like``'s dtype, ``(S_i, S_i)``:
    the offset along axis ``i`` joining each pair of its coordinates); the table is shared,
    read-only by convention.
    """
    backend = of(like)
    key = (rel.grid, rel.boundary, name, backend.name, dtype_name(like), backend.device(like))
    found = _PLACED.find(key)
    if found is not None:
        return found
    # Copies: the cached tables are read-only, and torch does not share read-only memory.
    if name == "offsets":
        table = backend.asarray(rel.offsets.astype(np.float64), like)
    elif name.startswith("axis_offsets"):
        i = int(name.removeprefix("axis_offsets"))
        table = backend.asarray((rel.axis_index(i) + rel.lows[i]).astype(np.float64), like)
    else:
        table = backend.asarray(rel.axis_index(int(name.removeprefix("axis_index"))), like, "int64")
    return _PLACED.put(key, table)


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


def _split(a: Array, widths: tuple[int, ...]) -> list[Array]:
    """``a`` cut along its second axis into pieces of ``widths``."""
    starts = [sum(widths[:i]) for i in range(len(widths))]
    return [a[:, s : s + w] for s, w in zip(starts, widths, strict=True)]
