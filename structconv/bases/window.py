r"""Banded per-axis factors: the windowed order of a :class:`~structconv.bases.kronecker.KroneckerBasis`.

A head that is local along an axis reads, for output :math:`n`, only the inputs
:math:`m = n + \delta` with :math:`\delta` in a window :math:`[\ell, h]` of width
:math:`w = h - \ell + 1`.  Its factor is then banded, and a pass of it costs :math:`w` instead
of :math:`S` multiply-adds per output.  The outputs are cut into blocks of :math:`b`; block
:math:`j` reads the :math:`b + w - 1` inputs from :math:`jb + \ell` on, so a pass is one batched
GEMM of ``(b, b + w - 1)`` blocks against shifted, overlapping views of the input ("shifted
GEMMs"): the work per output is :math:`b + w - 1`, whatever the grid's size, and no ``(S, S)``
factor, let alone an ``(N, N)`` matrix, is formed.

:class:`AxisBands` holds one axis' blocks and :class:`Window` one per axis together with the
error bound they were chosen for; :func:`run_window` applies them and :func:`cost_window` costs
them, as one order of the engine (:meth:`~structconv.Basis.own_orders`).  How the window and
its weights are chosen belongs to the heads (:meth:`structconv.QuadraticPosition.window`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..backend import Array, native, of
from .base import Cost


def block_size(width: int, size: int) -> int:
    """The output block of a band of ``width`` offsets on an axis of ``size``: about the width, 16 at least.

    A block of :math:`b` outputs costs :math:`b + w - 1` multiply-adds each; below 16 rows the
    batched GEMMs run far from peak, above the width they add zeros.
    """
    return max(1, min(size, max(16, 8 * math.ceil(width / 8))))


@dataclass(frozen=True)
class AxisBands:
    r"""One axis' banded factor, ``(K, n_b, b, b + w - 1)``.

    ``weights[k, j, r, c]`` is the weight of input :math:`jb + \ell + c` for output :math:`jb + r`
    in member :math:`k` (zero outside the member's own window, beyond the keys and past the last
    output; keys beyond the inputs but among the zero tokens of a padding keep their weight, and
    read zeros).

    Attributes
    ----------
    weights
        ``(K, n_b, b, b + w - 1)`` array.
    size
        :math:`S`, the axis' inputs and outputs.
    low
        :math:`\ell`, the smallest offset of any member's window.
    width
        :math:`w`.
    periodic
        Whether inputs wrap around the axis (else inputs beyond it read zeros).
    """

    weights: Array = field(repr=False)
    size: int
    low: int
    width: int
    periodic: bool

    @property
    def block(self) -> int:
        """:math:`b`, the outputs of one block."""
        return int(self.weights.shape[2])

    @property
    def blocks(self) -> int:
        """:math:`n_b = \\lceil S / b\\rceil`."""
        return int(self.weights.shape[1])

    @property
    def span(self) -> int:
        """:math:`b + w - 1`, the inputs of one block."""
        return int(self.weights.shape[3])

    def key(self) -> tuple[Any, ...]:
        """What the cost depends on: sizes only."""
        return (self.size, self.low, self.width, self.block, self.periodic)


@dataclass(frozen=True)
class Window:
    """Banded factors for every axis, and the bound on their error that chose them.

    Attributes
    ----------
    axes
        One :class:`AxisBands` per axis, all with the same members.
    radius
        ``(K,)`` per member, the radius :math:`R` its windows were chosen with.
    bound
        ``(K,)`` per member, an upper bound on the L1 distance of each of its columns from the exact one.
    tolerance
        The bound asked for: every entry of :attr:`bound` is at most it.
    """

    axes: tuple[AxisBands, ...]
    radius: np.ndarray = field(repr=False)
    bound: np.ndarray = field(repr=False)
    tolerance: float

    def key(self) -> tuple[Any, ...]:
        """The plan key's share: the bands' sizes."""
        return tuple(a.key() for a in self.axes)

    def describe(self) -> tuple[str, ...]:
        """Lines for :func:`structconv.explain`: the radii, the bands and the bound."""
        radii = ",".join(str(int(r)) for r in self.radius)
        widths = " x ".join(str(a.width) for a in self.axes)
        blocks = " x ".join(str(a.block) for a in self.axes)
        return (
            f"window: radius per head [{radii}]",
            f"window: band widths {widths}, output blocks {blocks}",
            f"window: each column within L1 {float(self.bound.max()):.2g} of the exact softmax "
            f"(asked {self.tolerance:g})",
        )

    def select(self, members: list[int]) -> Window:
        """The window of ``members`` only."""
        axes = tuple(
            AxisBands(a.weights[members], a.size, a.low, a.width, a.periodic) for a in self.axes
        )  # fmt: skip
        return Window(axes, self.radius[members], self.bound[members], self.tolerance)

    def to(self, convert: Any) -> Window:
        """The window with every weight array passed through ``convert`` (a move or a cast)."""
        axes = tuple(AxisBands(convert(a.weights), a.size, a.low, a.width, a.periodic) for a in self.axes)
        return Window(axes, self.radius, self.bound, self.tolerance)


def _padded(t: Array, bands: AxisBands) -> Array:
    r"""``t`` ``(G, A, S, R)`` read at :math:`\ell + u`, :math:`u < n_b b + w - 1`, along its third axis.

    Zeros beyond the axis, or its values wrapped around when periodic.
    """
    length = bands.blocks * bands.block + bands.width - 1
    S, low = bands.size, bands.low
    front, crop, end = max(0, -low), max(0, low), max(0, low + length - S)  # zeros before, rows dropped, zeros after
    if of(t).name == "torch":
        import torch
        from torch.nn import functional as F  # noqa: N812

        if bands.periodic:
            index = torch.remainder(torch.arange(low, low + length, device=t.device), S)
            return t.index_select(2, index)
        return F.pad(t[:, :, crop:], (0, 0, front, end))[:, :, :length]
    if bands.periodic:
        return np.take(t, np.remainder(np.arange(low, low + length), S), axis=2)
    return np.pad(t[:, :, crop:], ((0, 0), (0, 0), (front, end), (0, 0)))[:, :, :length]


def _windows(t: Array, bands: AxisBands) -> Array:
    """``(G, A, L, R)`` -> ``(G, A, n_b, b + w - 1, R)``: the overlapping inputs of every block (a view)."""
    b, span = bands.block, bands.span
    if of(t).name == "torch":
        return t.unfold(2, span, b).transpose(-1, -2)
    view = np.lib.stride_tricks.sliding_window_view(t, span, axis=2)[:, :, ::b]
    return np.swapaxes(view, -1, -2)


def band_pass(t: Array, bands: AxisBands) -> Array:
    """Apply every member's band along the third axis of ``t``.

    Parameters
    ----------
    t
        ``(G, A, S, R)``: ``G = 1`` (shared by the members; their blocks are stacked into one
        GEMM per block) or ``G = K`` (one slice per member).
    bands
        The axis' blocks.

    Returns
    -------
    Array
        ``(K, A, S, R)``.
    """
    lib = native(t)
    G, A, S, R = (int(v) for v in t.shape)
    K, nb, b, span = (int(v) for v in bands.weights.shape)
    inputs = _windows(_padded(t, bands), bands)  # (G, A, nb, span, R)
    w = bands.weights
    if G == 1:  # (nb, K b, span) @ (A, nb, span, R): the members share the input blocks
        stacked = lib.moveaxis(w, 0, 1).reshape(nb, K * b, span)
        out = (stacked @ inputs[0]).reshape(A, nb, K, b, R)
        out = lib.moveaxis(out, 2, 0)
    else:
        out = w[:, None] @ inputs  # (K, A, nb, b, R)
    return out.reshape(K, A, nb * b, R)[:, :, :S]


def run_window(window: Window, x: Array, theta: Array) -> Array:
    """:math:`y = \\sum_k \\tilde A_k^\\top x\\,\\Theta_k` with the banded factors :math:`\\tilde A_k`: ``(B, N, Q)``.

    The passes run on ``x`` shared by the members (the first as one GEMM per block for all of
    them), then one GEMM over :math:`(k, p)` with :math:`\\Theta`.

    Parameters
    ----------
    window
        The bands.
    x
        ``(B, M, P)``.
    theta
        ``(K, P, Q)``.
    """
    lib = native(x)
    B, M, P = (int(v) for v in x.shape)
    K, Q = int(theta.shape[0]), int(theta.shape[2])
    sizes = [a.size for a in window.axes]
    t = x.reshape(1, B, M, P)
    before = B
    for i, bands in enumerate(window.axes):
        after = math.prod(sizes[i + 1 :]) * P
        t = band_pass(t.reshape(int(t.shape[0]), before, sizes[i], after), bands)
        before *= sizes[i]
    rows = lib.moveaxis(t.reshape(K, B * M, P), 0, 1).reshape(B * M, K * P)
    return (rows @ theta.reshape(K * P, Q)).reshape(B, M, Q)


def cost_window(window: Window, batch: int, p: int, q: int, members: int) -> Cost:
    """The work of :func:`run_window`: the passes' block GEMMs, their copies, and the GEMM with Θ.

    The passes count as irregular work (:data:`~structconv.engine.plan.SPARSE_FLOP_WEIGHT`):
    their GEMMs have a block's rows on zero-padded, overlapping windows copied for the batched
    call, far from a GEMM's rate per flop (benchmarks/bench_positional_scaling.py measures where
    the exact per-axis passes, plain GEMMs on views, stop being the cheaper).
    """
    sizes = [a.size for a in window.axes]
    M = math.prod(sizes)
    flops = 2.0 * batch * M * members * p * q
    band = 0.0
    written = float(batch * M * (members * p + q))
    for i, a in enumerate(window.axes):
        rest = batch * (M // a.size) * p
        outputs = a.blocks * a.block
        band += 2.0 * members * rest * outputs * a.span
        # the padded input, its shifted blocks (copied for the batched GEMM) and the members' outputs
        copies = 1 if i == 0 else members
        written += float(copies * rest * (outputs + a.width + a.blocks * a.span) + members * rest * outputs)
    return Cost(flops, written, band)
