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

The basis geometry (:class:`~structconv.backend.stencil.Geometry`) and the per-backend kernels
(framing, the per-tap GEMMs, the shift-and-add, native convolutions) are methods of the array's
:class:`~structconv.backend.interface.Backend`; this module only lays the problem out.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..backend import Array, namespace, of
from ..backend.stencil import Geometry


def _tap_slices(geo: Geometry, j: int, lo: tuple[int, ...]) -> tuple[slice, ...]:
    """Slices of the padded frame that tap ``j`` reads for every output."""
    out = []
    for i in range(geo.ndim):
        start = int(geo.offsets[j, i]) + lo[i]
        out.append(slice(start, start + geo.stride[i] * (geo.out_grid[i] - 1) + 1, geo.stride[i]))
    return tuple(out)


def gather_taps(v: Array, geo: Geometry, *, diagonal: bool = False) -> Array:
    """Every tap of ``v``: the "A x first" side of the triangle (im2col).

    Entry ``[b, j, n, c]`` is ``v[b, m, c]`` for the input ``m`` read by tap ``j`` at output ``n``,
    zero where the read leaves a zero-bounded grid.

    Parameters
    ----------
    v
        ``(B, M, C)``, or ``(B, J, M, C)`` with ``diagonal``.
    geo
        The geometry of the shift basis.
    diagonal
        ``v`` holds one slice per tap, and tap ``j`` reads slice ``j`` only.
    """
    B, C = int(v.shape[0]), int(v.shape[-1])
    lo, hi = geo.reach
    lead = (B, geo.taps) if diagonal else (B,)
    padded = of(v).frame(v.reshape((math.prod(lead), *geo.grid, C)), lo, hi, geo.boundary)
    padded = padded.reshape((*lead, *padded.shape[1:]))
    views = []
    for j in range(geo.taps):
        head: tuple[Any, ...] = (slice(None), j) if diagonal else (slice(None),)
        views.append(padded[head + _tap_slices(geo, j, lo)])
    return namespace(v).stack(views, axis=1).reshape(B, geo.taps, math.prod(geo.out_grid), C)


@dataclass(frozen=True)
class FlatLayout:
    """How a stride-1 shift problem is laid out as one long matrix (see the module notes).

    Attributes
    ----------
    grid
        The grid placed in the frame (wrap-padded already if periodic).
    frame
        The frame's sizes, at least the grid's and the output grid's.
    out_grid
        The output grid.
    lead, tail
        Zero rows before the first frame and after the last.
    shifts
        The row shift of each tap, ``lead`` included.
    """

    grid: tuple[int, ...]
    frame: tuple[int, ...]
    out_grid: tuple[int, ...]
    lead: int
    tail: int
    shifts: tuple[int, ...]

    def rows(self, batch: int) -> int:
        """The rows of ``batch`` frames (the flat output's, before cropping).

        Parameters
        ----------
        batch
            :math:`B`, the instances.
        """
        return batch * math.prod(self.frame)


def flat_layout(geo: Geometry) -> tuple[FlatLayout, tuple[int, ...]]:
    """The layout of a stride-1 problem and the wrap padding to apply first (periodic grids; else ``()``).

    Parameters
    ----------
    geo
        The geometry of a shift basis of stride 1.
    """
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
    """Lay ``x`` out as the ``(lead + B * frame + tail, C)`` matrix of the flat layout; return it and the layout.

    Parameters
    ----------
    x
        ``(B, M, C)``.
    geo
        The geometry of a shift basis of stride 1.
    """
    layout, wrap = flat_layout(geo)
    B, _, C = (int(s) for s in x.shape)
    xg = x.reshape((B, *geo.grid, C))
    if wrap:
        lo, hi = geo.reach
        xg = of(x).frame(xg, lo, hi, "periodic")
    rows = layout.rows(B)
    total = layout.lead + rows + layout.tail
    inner = tuple(slice(0, g) for g in layout.grid)
    buf = of(x).zeros((total, C), x)
    # Rows of a contiguous matrix: the reshape is a view on either backend, so this writes into buf.
    buf[layout.lead : layout.lead + rows].reshape(B, *layout.frame, C)[(slice(None), *inner)] = xg
    return buf, layout


def crop_output(y_ext: Array, layout: FlatLayout, batch: int) -> Array:
    """``(B * frame, Q)`` extended output -> ``(B, N, Q)``.

    Parameters
    ----------
    y_ext
        The flat output, one row per frame entry.
    layout
        The layout it was computed on.
    batch
        :math:`B`.
    """
    Q = int(y_ext.shape[-1])
    y = y_ext.reshape(batch, *layout.frame, Q)
    if layout.frame != layout.out_grid:
        y = y[(slice(None), *(slice(0, o) for o in layout.out_grid))]
    return y.reshape(batch, math.prod(layout.out_grid), Q)


def shift_then_gemm(x: Array, thetas: Array, geo: Geometry) -> Array:
    r""":math:`y_{bn} = \sum_j x_{b,\,n+o_j}\,\Theta'_j` with one GEMM per tap on contiguous rows (stride 1).

    Parameters
    ----------
    x
        ``(B, M, P)``.
    thetas
        :math:`\Theta'_j`, one ``(P, Q)`` map per tap: ``(J, P, Q)``.
    geo
        The geometry of a shift basis of stride 1.
    """
    buf, layout = flat_input(x, geo)
    B = int(x.shape[0])
    return crop_output(of(x).shift_gemm(buf, thetas, layout.shifts, layout.rows(B)), layout, B)


def gemm_then_shift(x: Array, thetas: Array, geo: Geometry) -> Array:
    r"""One GEMM :math:`S = x\,[\Theta'_1\cdots\Theta'_J]`, then :math:`y_{bn} = \sum_j S_{b,n+o_j,j}` (stride 1).

    Parameters
    ----------
    x, thetas, geo
        As for :func:`shift_then_gemm`.
    """
    buf, layout = flat_input(x, geo)
    B = int(x.shape[0])
    return crop_output(of(x).gemm_shift(buf, thetas, layout.shifts, layout.rows(B)), layout, B)
