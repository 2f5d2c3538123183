r"""Kernels that apply shift matrices by slicing, on NumPy and torch alike.

A shift basis reads, for output position :math:`n` (a multi-index of the output grid) and
tap :math:`j`, the input at :math:`s\odot n + o_j` (stride :math:`s`, offset :math:`o_j`), or
nothing where that position leaves a zero-bounded grid.  Three ways to evaluate it live here:

* :func:`gather_taps` materialises every tap, :math:`(B, J, N, C)` (im2col);
* :func:`shift_then_gemm` never stores the :math:`J` shifted copies: it lays the zero-padded
  input out as one long matrix so that every tap becomes a *contiguous* block of rows, and
  accumulates one GEMM per tap (stride 1 only);
* :func:`gemm_then_shift` does one wide GEMM :math:`x\,[\Theta_1 \cdots \Theta_J]` and adds
  shifted row blocks of the result (stride 1 only).

The flat layout works because a shift by :math:`o` on a row-major grid is a shift by
:math:`\sum_i o_i\,\sigma_i` of the flattened rows (:math:`\sigma` the row-major strides of the
padded frame).  Outputs near the right edge of a row then read into the next row; leaving a
zero gap of :math:`\max(\text{pad before}, \text{pad after})` entries after each row (and each
image) makes every such read land on a zero, and the extra output rows are cropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from ..backend import Array, is_torch


@dataclass(frozen=True)
class Window:
    """The input window of a native call: a crop, or wrapped indices, then padding.

    ``padding`` is the symmetric zero padding the native call applies itself; ``frame_lo`` and
    ``frame_hi`` the asymmetric zero padding applied before it (all zeros when none).
    """

    crop: tuple[slice, ...] | None
    wrap: tuple[np.ndarray, ...] | None
    padding: tuple[int, ...]
    frame_lo: tuple[int, ...]
    frame_hi: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class Geometry:
    """Input grid, output grid, stride, tap offsets and boundary of a shift basis."""

    grid: tuple[int, ...]
    out_grid: tuple[int, ...]
    stride: tuple[int, ...]
    offsets: np.ndarray  # (J, d) int64, input offset of each tap relative to stride * n
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
            wrap = tuple(np.arange(begin, end) % g for (begin, end), g in zip(spans, self.grid, strict=True))
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


# --- backend-neutral array helpers ------------------------------------------------------------
def _torch() -> Any:
    import torch

    return torch


def frame(xg: Array, lo: tuple[int, ...], hi: tuple[int, ...], boundary: str) -> Array:
    """Pad the grid axes ``1..d`` of ``xg`` (shape ``(B, *grid, C)``) with zeros or wrapped entries."""
    d = len(lo)
    if not any(lo) and not any(hi):
        return xg
    if boundary == "periodic":
        out = xg
        for i in range(d):
            size = int(xg.shape[1 + i])
            idx = np.arange(-lo[i], size + hi[i]) % size
            if is_torch(out):
                out = out.index_select(1 + i, _torch().as_tensor(idx, device=out.device))
            else:
                out = np.take(out, idx, axis=1 + i)
        return out
    if is_torch(xg):
        pads: list[int] = [0, 0]
        for i in reversed(range(d)):
            pads += [lo[i], hi[i]]
        return _torch().nn.functional.pad(xg, pads)
    return np.pad(xg, [(0, 0)] + list(zip(lo, hi, strict=True)) + [(0, 0)])


def _stack(arrays: list[Array], axis: int) -> Array:
    return _torch().stack(arrays, axis) if is_torch(arrays[0]) else np.stack(arrays, axis)


def _tap_slices(geo: Geometry, j: int, lo: tuple[int, ...]) -> tuple[slice, ...]:
    """Slices of the padded frame that tap ``j`` reads for every output."""
    out = []
    for i in range(geo.ndim):
        start = int(geo.offsets[j, i]) + lo[i]
        out.append(slice(start, start + geo.stride[i] * (geo.out_grid[i] - 1) + 1, geo.stride[i]))
    return tuple(out)


def gather_taps(v: Array, geo: Geometry, layout: str = "bjnc", diagonal: bool = False) -> Array:
    """Every tap of ``v`` (shape ``(B, M, C)``): ``(B, J, N, C)`` or, with ``layout="bnjc"``, ``(B, N, J, C)``.

    Entry ``[b, j, n, c]`` is ``v[b, m, c]`` for the input ``m`` read by tap ``j`` at output ``n``
    (zero where the read leaves a zero-bounded grid): the "A x first" side of the triangle.
    With ``diagonal=True``, ``v`` has shape ``(B, J, M, C)`` and tap ``j`` reads slice ``j`` only.
    """
    B, C = int(v.shape[0]), int(v.shape[-1])
    lo, hi = geo.reach
    lead = (B, geo.taps) if diagonal else (B,)
    padded = frame(v.reshape((math.prod(lead), *geo.grid, C)), lo, hi, geo.boundary)
    padded = padded.reshape((*lead, *padded.shape[1:]))
    views = []
    for j in range(geo.taps):
        head: tuple[Any, ...] = (slice(None), j) if diagonal else (slice(None),)
        views.append(padded[head + _tap_slices(geo, j, lo)])
    N = math.prod(geo.out_grid)
    if layout == "bnjc":
        return _stack(views, 1 + geo.ndim).reshape(B, N, geo.taps, C)
    return _stack(views, 1).reshape(B, geo.taps, N, C)


@dataclass(frozen=True)
class FlatLayout:
    """How a stride-1 shift problem is laid out as one long matrix (see the module notes)."""

    grid: tuple[int, ...]  # the grid placed in the frame (wrap-padded already if periodic)
    frame: tuple[int, ...]  # frame sizes, >= grid and >= output grid
    out_grid: tuple[int, ...]
    lead: int  # zero rows before the first frame
    tail: int  # zero rows after the last frame
    shifts: tuple[int, ...]  # row shift of each tap, lead included

    def rows(self, batch: int) -> int:
        return batch * math.prod(self.frame)


def flat_layout(geo: Geometry) -> tuple[FlatLayout, tuple[int, ...]]:
    """The layout of a stride-1 problem and the wrap padding to apply first (periodic grids)."""
    offsets = geo.offsets
    lo, hi = geo.reach
    if geo.boundary == "periodic":
        grid = tuple(g + a + b for g, a, b in zip(geo.grid, lo, hi, strict=True))
        offsets = offsets + np.asarray(lo, dtype=np.int64)
        gap = (0,) * geo.ndim
        wrap = lo
    else:
        grid = geo.grid
        gap = tuple(max(a, b) for a, b in zip(lo, hi, strict=True))
        wrap = ()
    frame_ = tuple(max(g + p, o) for g, p, o in zip(grid, gap, geo.out_grid, strict=True))
    strides = [math.prod(frame_[i + 1 :]) for i in range(geo.ndim)]
    flat = [int(sum(int(o[i]) * strides[i] for i in range(geo.ndim))) for o in offsets]
    lead, tail = max(0, -min(flat)), max(0, max(flat))
    return FlatLayout(grid, frame_, geo.out_grid, lead, tail, tuple(f + lead for f in flat)), wrap


def flat_input(x: Array, geo: Geometry) -> tuple[Array, FlatLayout]:
    """Lay ``x`` (``(B, M, C)``) out as the ``(lead + B * frame + tail, C)`` matrix of the flat layout."""
    layout, wrap = flat_layout(geo)
    B, _, C = (int(s) for s in x.shape)
    xg = x.reshape((B, *geo.grid, C))
    if wrap:
        lo, hi = geo.reach
        xg = frame(xg, lo, hi, "periodic")
    rows = layout.rows(B)
    total = layout.lead + rows + layout.tail
    inner = tuple(slice(0, g) for g in layout.grid)
    if is_torch(x):
        buf = x.new_zeros((total, C))
        buf[layout.lead : layout.lead + rows].view(B, *layout.frame, C)[(slice(None), *inner)] = xg
    else:
        buf = np.zeros((total, C), dtype=x.dtype)
        buf[layout.lead : layout.lead + rows].reshape(B, *layout.frame, C)[(slice(None), *inner)] = xg
    return buf, layout


def crop_output(y_ext: Array, layout: FlatLayout, batch: int) -> Array:
    """``(B * frame, Q)`` extended output -> ``(B, N, Q)``."""
    Q = int(y_ext.shape[-1])
    y = y_ext.reshape(batch, *layout.frame, Q)
    if layout.frame != layout.out_grid:
        y = y[(slice(None), *(slice(0, o) for o in layout.out_grid))]
    return y.reshape(batch, math.prod(layout.out_grid), Q)


def shift_then_gemm(x: Array, thetas: Array, geo: Geometry) -> Array:
    r""":math:`y_{bn} = \sum_j x_{b,\,n+o_j}\,\Theta'_j` with one GEMM per tap on contiguous rows (stride 1)."""
    buf, layout = flat_input(x, geo)
    B = int(x.shape[0])
    rows = layout.rows(B)
    if is_torch(x):
        from ..backend.shift_torch import shift_gemm

        y_ext = shift_gemm(buf, thetas, layout.shifts, rows)
    else:
        y_ext = buf[layout.shifts[0] : layout.shifts[0] + rows] @ thetas[0]
        for j in range(1, len(layout.shifts)):
            f = layout.shifts[j]
            y_ext += buf[f : f + rows] @ thetas[j]
    return crop_output(y_ext, layout, B)


def gemm_then_shift(x: Array, thetas: Array, geo: Geometry) -> Array:
    r"""One GEMM :math:`S = x\,[\Theta'_1\cdots\Theta'_J]`, then :math:`y_{bn} = \sum_j S_{b,n+o_j,j}` (stride 1)."""
    buf, layout = flat_input(x, geo)
    B = int(x.shape[0])
    J, P, Q = (int(s) for s in thetas.shape)
    rows = layout.rows(B)
    wide = (thetas.permute(1, 0, 2) if is_torch(thetas) else thetas.transpose(1, 0, 2)).reshape(P, J * Q)
    s = (buf @ wide).reshape(-1, J, Q)
    if is_torch(x):
        from ..backend.shift_torch import ShiftAdd

        y_ext = ShiftAdd.apply(  # type: ignore[no-untyped-call]
            s, layout.shifts, rows
        )
    else:
        y_ext = s[layout.shifts[0] : layout.shifts[0] + rows, 0].copy()
        for j in range(1, J):
            f = layout.shifts[j]
            y_ext += s[f : f + rows, j]
    return crop_output(y_ext, layout, B)
