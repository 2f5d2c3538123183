r"""Block-local heads: every entry of a windowed head as a weight of its own.

A :class:`~structconv.bases.window.Window` stores each head as a product of per-axis bands, so an
entry :math:`(m, n)` is a product of per-axis weights.  Attention dropout draws one Bernoulli
variable per entry, which no product of per-axis factors can carry.  :class:`LocalBasis` keeps
the entries of a window one by one, block by block: the queries of a block of
:math:`b_1 \times\cdots\times b_d` grid positions and the keys of its
:math:`(b_1 + w_1 - 1)\times\cdots` window, ``(K, n_b, \prod b_i, \prod (b_i + w_i - 1))``, so a
head costs :math:`\prod_i (b_i + w_i - 1)` weights per query instead of :math:`N`, and applying it
is one batched GEMM per block against the keys it reads (copied once, overlapping).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..backend import Array, device_of, namespace, native, of, shape_str
from .base import Basis, Cost
from .dense import DenseBasis
from .window import Window, _padded, _windows


def local_weights(window: Window) -> Array:
    r"""The window's entries, ``(n_b, K, \prod b_i, \prod s_i)`` with :math:`s_i = b_i + w_i - 1`.

    Block :math:`(j_1, \dots, j_d)` (row-major) holds the products of the axes' block weights;
    the blocks come first, so that the members of a block are one GEMM's rows.
    """
    lib = native(window.axes[0].weights)
    out = lib.moveaxis(window.axes[0].weights, 1, 0)  # (nb_1, K, b_1, s_1)
    for bands in window.axes[1:]:
        w = lib.moveaxis(bands.weights, 1, 0)  # (nb_2, K, b_2, s_2)
        nb, K, b, s = (int(v) for v in out.shape)
        nb2, _, b2, s2 = (int(v) for v in w.shape)
        out = out[:, None, :, :, None, :, None] * w[None, :, :, None, :, None, :]  # (nb, nb2, K, b, b2, s, s2)
        out = out.reshape(nb * nb2, K, b * b2, s * s2)
    return out


class LocalBasis(Basis):
    """Heads given by their entries on the blocks of a window (see the module's docstring).

    Parameters
    ----------
    weights
        ``(n_b, K, Q_b, K_b)``: for block ``j`` and member ``k``, the weight of the block's
        ``c``-th key for its ``r``-th query (row-major within the block's queries and keys), as
        :func:`local_weights` lays them.
    window
        The window whose layout ``weights`` follows (its sizes, offsets and blocks).
    """

    __slots__ = ("_weights", "_window")
    representation = "local"

    def __init__(self, weights: Array, window: Window) -> None:
        K = int(window.axes[0].weights.shape[0])
        blocks = math.prod(a.blocks for a in window.axes)
        queries = math.prod(a.block for a in window.axes)
        keys = math.prod(a.span for a in window.axes)
        if tuple(int(v) for v in weights.shape) != (blocks, K, queries, keys):
            raise ValueError(
                f"weights must have shape (n_b, K, Q_b, K_b) = {(blocks, K, queries, keys)} for this window, "
                f"got {shape_str(tuple(weights.shape))}"
            )
        self._weights, self._window = weights, window

    @property
    def weights(self) -> Array:
        """The entries, ``(n_b, K, Q_b, K_b)``."""
        return self._weights

    @property
    def shape(self) -> tuple[int, ...]:
        M = math.prod(a.size for a in self._window.axes)
        return (int(self._weights.shape[1]), M, M)

    @property
    def backend(self) -> str:
        return of(self._weights).name

    @property
    def dtype(self) -> Any:
        return self._weights.dtype

    @property
    def device(self) -> str:
        return device_of(self._weights)

    def plan_key(self) -> tuple[Any, ...]:
        return (*super().plan_key(), self._window.key())

    # --- the blocks ------------------------------------------------------------------------------
    def _keys(self, t: Array) -> Array:
        """``t`` ``(G, B, M, C)`` -> ``(G, B, n_b, K_b, C)``: every block's keys (one overlapping copy)."""
        G, B, _, C = (int(v) for v in t.shape)
        axes = self._window.axes
        d = len(axes)
        u = t.reshape(G * B, *[a.size for a in axes], C)
        # Axis by axis: the axis becomes (n_b, s) with the window's zeros or wraparound.
        for i, bands in enumerate(axes):
            lead = math.prod(int(v) for v in u.shape[: 1 + 2 * i])
            rest = math.prod(int(v) for v in u.shape[2 + 2 * i :])
            flat = u.reshape(1, lead, bands.size, rest)
            blocked = _windows(_padded(flat, bands), bands)  # (1, lead, nb, s, rest)
            before, after = [int(v) for v in u.shape[: 1 + 2 * i]], [int(v) for v in u.shape[2 + 2 * i :]]
            u = blocked.reshape(*before, bands.blocks, bands.span, *after)
        # (GB, nb_1, s_1, ..., nb_d, s_d, C) -> (GB, nb_1..nb_d, s_1..s_d, C)
        order = [0] + [1 + 2 * i for i in range(d)] + [2 + 2 * i for i in range(d)] + [1 + 2 * d]
        u = namespace(u).permute_dims(u, tuple(order))
        blocks = math.prod(a.blocks for a in axes)
        return u.reshape(G, B, blocks, math.prod(a.span for a in axes), C)

    def _outputs(self, out: Array) -> Array:
        """``(B, n_b, K, Q_b, C)`` -> ``(B, K, N, C)``: the blocks' queries back on the grid, cropped."""
        B, _, K, _, C = (int(v) for v in out.shape)
        axes = self._window.axes
        d = len(axes)
        grid = out.reshape(B, *[a.blocks for a in axes], K, *[a.block for a in axes], C)
        # (B, nb_1..nb_d, K, b_1..b_d, C) -> (B, K, nb_1, b_1, ..., nb_d, b_d, C)
        order = [0, 1 + d] + [p for i in range(d) for p in (1 + i, 2 + d + i)] + [2 + 2 * d]
        grid = namespace(grid).permute_dims(grid, tuple(order)).reshape(B, K, *[a.blocks * a.block for a in axes], C)
        crop = (slice(None), slice(None), *[slice(0, a.size) for a in axes], slice(None))
        return grid[crop].reshape(B, K, self.N, C)

    def _apply(self, t: Array) -> Array:
        """``t`` ``(B, G, M, C)``, ``G`` = 1 (shared) or K: every member on its slice, ``(B, K, N, C)``."""
        lib = native(t)
        B, G, _, C = (int(v) for v in t.shape)
        nb, K, qb, kb = (int(v) for v in self._weights.shape)
        keys = self._keys(lib.moveaxis(t, 1, 0))  # (G, B, nb, Kb, C)
        if G == 1:  # the members of a block stacked into one GEMM on the keys they share
            out = (self._weights.reshape(nb, K * qb, kb) @ keys[0]).reshape(B, nb, K, qb, C)
        else:
            # (nb, K, Qb, Kb) @ (B, nb, K, Kb, C)
            out = self._weights @ namespace(keys).permute_dims(keys, (1, 2, 0, 3, 4))
        return self._outputs(out)

    def apply_each(self, x: Array) -> Array:
        return self._apply(x[:, None])

    def apply_members(self, s: Array, *, reduce: bool) -> Array:
        out = self._apply(s)
        return out.sum(1) if reduce else out

    def _cost(self, batch: int, channels: int, slices: int) -> Cost:
        nb, K, qb, kb = (int(v) for v in self._weights.shape)
        keys = float(slices * batch * nb * kb * channels)
        return Cost(2.0 * batch * K * nb * qb * kb * channels, keys + 2.0 * batch * K * nb * qb * channels)

    def cost_each(self, batch: int, channels: int) -> Cost:
        return self._cost(batch, channels, 1)

    def cost_members(self, batch: int, channels: int, *, reduce: bool) -> Cost:
        return self._cost(batch, channels, self.K)

    # --- values ----------------------------------------------------------------------------------
    def to_dense(self) -> Array:
        """The ``(K, M, N)`` heads (for tests and analyses: :math:`O(KMN)`)."""
        lib = native(self._weights)
        M = self.M
        eye = of(self._weights).asarray(np.eye(M), self._weights, None)
        # Column n of member k is A_k^T e_n read back: apply the basis to the identity's rows.
        out = self._apply(eye.reshape(1, 1, M, M))[0]  # (K, N, M): row n = (A_k^T e)_n over inputs
        return lib.moveaxis(out, -1, -2)

    def transpose(self) -> Basis:
        return DenseBasis.of_weights(self.to_dense().swapaxes(-1, -2))

    def select(self, members: Sequence[int]) -> LocalBasis:
        index = list(members)
        return LocalBasis(self._weights[:, index], self._window.select(index))

    def to(self, device: Any = None, dtype: Any = None) -> LocalBasis:
        def move(a: Array) -> Array:
            return DenseBasis.of_weights(a).to(device, dtype).to_dense()

        return LocalBasis(move(self._weights), self._window.to(move))

    def __repr__(self) -> str:
        blocks = " x ".join(f"{a.block}+{a.width - 1}" for a in self._window.axes)
        return f"LocalBasis(K={self.K}, M={self.M}, blocks {blocks}, backend={self.backend}, dtype={self.dtype})"


__all__ = ["LocalBasis", "local_weights"]
