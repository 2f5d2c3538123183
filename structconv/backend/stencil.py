r"""The geometry of a shift (stencil) basis: integers only, shared by every backend.

A shift basis reads, for output position :math:`n` of the output grid and tap :math:`j`, the
input at :math:`s\odot n + o_j` (stride :math:`s`, offset :math:`o_j`).  :class:`Geometry`
holds the grid sizes, the stride, the :math:`J\times d` offsets and the boundary, and derives
once (cached) what every kernel needs: the reach beyond the grid, the dilated box of a native
kernel, the window a native call reads, and the flat input index of every (tap, output).  It
holds no floating arrays, so the NumPy and torch kernels of the backend layer both take it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np


@dataclass(frozen=True)
class Window:
    """The input window of a native call: a crop, or wrapped indices, then padding.

    Attributes
    ----------
    crop
        Per grid axis, the slice of the grid read, or ``None`` to read it whole.
    wrap
        Per grid axis, the entries read on a periodic grid as runs ``(start, length)`` of the
        grid, in order, or ``None``.
    padding
        The symmetric zero padding the native call applies itself.
    frame_lo, frame_hi
        The asymmetric zero padding applied before the call (all zeros when none).
    """

    crop: tuple[slice, ...] | None
    wrap: tuple[tuple[tuple[int, int], ...], ...] | None
    padding: tuple[int, ...]
    frame_lo: tuple[int, ...]
    frame_hi: tuple[int, ...]


def _runs(begin: int, end: int, size: int) -> tuple[tuple[int, int], ...]:
    """The entries ``begin, ..., end - 1`` of a periodic axis of ``size`` as runs ``(start, length)`` inside it.

    Slices joined, not an index gather: Inductor's CPU code for the backward of two gathers
    along successive axes (before a convolution) writes out of bounds in torch 2.13.
    """
    runs = []
    i = begin
    while i < end:
        start = i % size
        length = min(size - start, end - i)
        runs.append((start, length))
        i += length
    return tuple(runs)


@dataclass(frozen=True, eq=False)
class Geometry:
    r"""Input grid, output grid, stride, tap offsets and boundary of a shift basis.

    Parameters
    ----------
    grid, out_grid
        The input and output grid sizes.
    stride
        :math:`s`, per grid axis.
    offsets
        :math:`o_j`, int64 ``(J, d)``: tap :math:`j` at output :math:`n` reads input
        :math:`s\odot n + o_j`.
    boundary
        ``"zero"`` or ``"periodic"``.
    """

    grid: tuple[int, ...]
    out_grid: tuple[int, ...]
    stride: tuple[int, ...]
    offsets: np.ndarray
    boundary: str

    @property
    def ndim(self) -> int:
        return len(self.grid)

    @property
    def taps(self) -> int:
        return int(self.offsets.shape[0])

    @cached_property
    def key(self) -> tuple[Any, ...]:
        """A hashable summary (used in plan keys)."""
        return (self.grid, self.out_grid, self.stride, self.boundary, self.offsets.tobytes(), self.offsets.shape)

    @cached_property
    def reach(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Entries read before the first and after the last input entry, per dimension."""
        lo = tuple(max(0, -int(self.offsets[:, i].min())) for i in range(self.ndim))
        hi = tuple(
            max(0, self.stride[i] * (self.out_grid[i] - 1) + int(self.offsets[:, i].max()) - (self.grid[i] - 1))
            for i in range(self.ndim)
        )
        return lo, hi

    @property
    def unit_stride(self) -> bool:
        return all(s == 1 for s in self.stride)

    @cached_property
    def box(self) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...], np.ndarray]:
        """The smallest dilated box holding every tap: (origin, dilation, size, tap -> box index)."""
        origin = tuple(int(self.offsets[:, i].min()) for i in range(self.ndim))
        rel = self.offsets - np.asarray(origin, dtype=np.int64)
        dilation = tuple(max(1, math.gcd(*(int(v) for v in rel[:, i]))) for i in range(self.ndim))
        rel = rel // np.asarray(dilation, dtype=np.int64)
        size = tuple(int(rel[:, i].max()) + 1 for i in range(self.ndim))
        index = np.ravel_multi_index(tuple(rel.T), size).astype(np.int64) if self.ndim else np.zeros(0, np.int64)
        return origin, dilation, size, index

    @property
    def box_volume(self) -> int:
        return math.prod(self.box[2])

    @cached_property
    def is_full_box(self) -> bool:
        """Whether the taps are exactly the box, in row-major order (a plain torch kernel)."""
        index = self.box[3]
        return self.taps == self.box_volume and bool((index == np.arange(self.taps)).all())

    @cached_property
    def window(self) -> Window:
        """Where the native call reads the input: computed once, since every call reads the same window."""
        origin, dilation, size, _ = self.box
        spans = []
        for i in range(self.ndim):
            extent = self.stride[i] * (self.out_grid[i] - 1) + dilation[i] * (size[i] - 1) + 1
            spans.append((origin[i], origin[i] + extent))
        if self.boundary == "periodic":
            wrap = tuple(_runs(begin, end, g) for (begin, end), g in zip(spans, self.grid, strict=True))
            return Window(None, wrap, (0,) * self.ndim, (0,) * self.ndim, (0,) * self.ndim)
        # The native call's own symmetric padding p reads the same entries whenever the window
        # starts at -p and the call then yields exactly the output grid (e.g. a strided kernel whose
        # last padded column is never read): no crop and no padded copy are needed.
        pads = tuple(-begin for begin, _ in spans)
        native = tuple(
            (g + 2 * p - dl * (k - 1) - 1) // st + 1
            for g, p, dl, k, st in zip(self.grid, pads, dilation, size, self.stride, strict=True)
        )
        if all(p >= 0 for p in pads) and native == self.out_grid:
            return Window(None, None, pads, (0,) * self.ndim, (0,) * self.ndim)
        lo, hi, cut = [], [], []
        for (begin, end), g in zip(spans, self.grid, strict=True):
            a = min(max(begin, 0), g)
            b = max(min(end, g), a)
            cut.append(slice(a, b))
            # A window wholly outside the grid reads nothing: all of it is padding.
            lo.append(a - begin if b > a else end - begin)
            hi.append(end - b if b > a else 0)
        crop = any(c.start > 0 or c.stop < g for c, g in zip(cut, self.grid, strict=True))
        if lo == hi:
            return Window(tuple(cut) if crop else None, None, tuple(lo), (0,) * self.ndim, (0,) * self.ndim)
        return Window(tuple(cut) if crop else None, None, (0,) * self.ndim, tuple(lo), tuple(hi))

    @cached_property
    def tap_index(self) -> np.ndarray:
        """Flat input index read by each (tap, output), ``-1`` where it leaves a zero boundary."""
        coords = np.stack(np.meshgrid(*[np.arange(n) for n in self.out_grid], indexing="ij"), -1).reshape(-1, self.ndim)
        pos = coords[None] * np.asarray(self.stride) + self.offsets[:, None, :]
        size = np.asarray(self.grid)
        if self.boundary == "periodic":
            pos = pos % size
            wrapped: np.ndarray = np.ravel_multi_index(tuple(np.moveaxis(pos, -1, 0)), self.grid)
            return wrapped.astype(np.int64)
        inside = ((pos >= 0) & (pos < size)).all(-1)
        flat = np.ravel_multi_index(tuple(np.moveaxis(np.where(inside[..., None], pos, 0), -1, 0)), self.grid)
        return np.where(inside, flat, -1).astype(np.int64)

    @cached_property
    def valid_counts(self) -> np.ndarray:
        """For each tap and output, 1 if the read is inside the grid (``(J, N)`` float)."""
        return (self.tap_index >= 0).astype(np.float64)
