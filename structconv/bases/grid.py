r"""Grid convolution: shift matrices and structured shift bases (Andreoli, §2.1, Def. 1–2).

A grid :math:`\bar S` of sizes :math:`S = (S_1, \dots, S_d)` is flattened row-major.  The shift
matrix of Def. 1 is :math:`(\mathcal A_{\mathbf d})_{mn} = \mathbb 1[\omega^{-1}n -
\omega^{-1}m = \mathbf d]`: output :math:`n` reads input :math:`n - \mathbf d`.

A :class:`GridBasis` generalises it to strided, padded, dilated and irregular windows: output
position :math:`n` of member :math:`k` reads

.. math:: A_{k,mn} = \sum_j w_{kj}\,\mathbb 1[m = s\odot n + o_j]

for taps :math:`o_j` (offsets), stride :math:`s` and tap weights :math:`w` (the identity for a
convolution: one tap per member).  Reads outside a ``"zero"`` grid are missing entries (zero
padding); a ``"periodic"`` grid wraps them.  Offsets use torch's cross-correlation sign, so
:math:`o_j = -\Delta_j` in the paper's notation and a 3×3 "same" kernel has offsets
:math:`\{-1, 0, 1\}^2` in the row-major order of ``weight.flatten(2)``.

The basis stores the geometry (sizes, stride, the :math:`J\times d` offsets), never a
:math:`K\times M\times N` tensor, and the engine runs it natively (``F.conv*d``), by slicing
along either side of the triangle, sparsely, or densely.  This module holds the representation;
its builders (:func:`~structconv.grid_basis`, :func:`~structconv.avg_pool_basis`,
:func:`~structconv.shift_matrix`, :func:`~structconv.apply_shifts`) are in
``structconv.structures.grid``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from typing import Any

import numpy as np

from ..backend import Array, as_index, einsum, find, of, shape_str
from ..backend.checks import check_array
from ..backend.stencil import Geometry
from .base import Basis, Cost, OwnOrder, _member_list
from .grid_args import BOUNDARIES, Size, _check_boundary, _grid, _ints, _placement
from .shift import flat_layout, gather_taps, gemm_then_shift, shift_then_gemm
from .sparse import SparseBasis

__all__ = ["BOUNDARIES", "GridBasis", "Size", "_check_boundary", "_grid", "_ints", "_placement"]


# --- the basis --------------------------------------------------------------------------------------
class GridBasis(Basis):
    r"""A structured shift basis: :math:`A_{k,mn} = c_n \sum_j w_{kj}\,\mathbb 1[m = s\odot n + o_j]`.

    Build it with :func:`~structconv.grid_basis`, :func:`~structconv.avg_pool_basis` or
    :func:`~structconv.shift_matrix`.  It holds
    the grid sizes, the stride, the :math:`J` tap offsets and (optionally) the ``(K, J)`` tap
    weights, so its memory does not grow with the grid beyond :math:`O(J\,d)`.

    Parameters
    ----------
    grid, out_grid
        Input and output grid sizes (``M`` and ``N`` are their products).
    offsets
        ``(J, d)`` integer input offsets of the taps, relative to :math:`s\odot n`.
    stride
        Per-dimension stride :math:`s`.
    boundary
        ``"zero"`` (reads outside the grid are missing entries) or ``"periodic"``.
    weights
        ``None`` (member ``k`` is tap ``k`` with weight 1, a convolution) or a ``(K, J)`` array of
        tap weights on the basis' backend (it may require grad).
    normalize
        Scale each column so that its in-grid weights sum to one (:math:`c_n`; ``K = 1`` only),
        as average pooling without padded entries does.
    scale
        An explicit ``(N,)`` column scale :math:`c_n` on the basis' backend (instead of
        ``normalize``), e.g. the per-window divisors of ``ceil_mode`` pooling.
    like
        An array whose backend, dtype and device the basis takes (default NumPy float64); taken
        from ``weights`` when given.

    Notes
    -----
    The stride-1 ``"ax"`` and ``"xtheta"`` orders run hand-written backward passes written in
    differentiable torch operations, so double backward (gradient penalties, meta-learning) is
    exact through every order.

    A basis without tap weights holds no arrays (:attr:`placement_free`): the engine applies it
    to any floating ``x`` on that array's backend, dtype and device, whatever ``like`` said.
    """

    __slots__ = ("_device", "_dtype", "_impl", "geometry", "normalize", "scale", "weights")
    representation = "shift"

    def __init__(
        self,
        grid: Size,
        out_grid: Size,
        offsets: Any,
        *,
        stride: Size = 1,
        boundary: str = "zero",
        weights: Array | None = None,
        normalize: bool = False,
        like: Array | None = None,
        scale: Array | None = None,
    ) -> None:
        g = _grid(grid)
        d = len(g)
        out = _ints(out_grid, d, "out_grid", 1)
        st = _ints(stride, d, "stride", 1)
        _check_boundary(boundary)
        off = np.asarray(offsets)
        if off.ndim != 2 or off.shape[1] != d or off.shape[0] == 0 or not np.issubdtype(off.dtype, np.integer):
            raise ValueError(f"offsets must be a non-empty integer array of shape (J, {d}), got {off.shape}")
        self.geometry = Geometry(g, out, st, off.astype(np.int64), boundary)
        if weights is not None:
            check_array(weights, "weights", (2,), ("(K, J)",))
        self._impl, self._dtype, self._device = _placement(weights if weights is not None else like)
        if weights is not None and (weights.ndim != 2 or tuple(weights.shape)[1:] != (off.shape[0],)):
            raise ValueError(
                f"weights must have shape (K, {off.shape[0]}) (one weight per member and tap), "
                f"got {shape_str(tuple(weights.shape))}"
            )
        members = off.shape[0] if weights is None else int(weights.shape[0])
        if normalize and members != 1:
            raise ValueError("normalize=True needs a single member (K=1); concat single-member bases for more")
        if scale is not None:
            if check_array(scale, "scale", (1,), ("(N,)",)) != self.backend or int(scale.shape[0]) != math.prod(out):
                raise ValueError(
                    f"scale must be a {self.backend} array of shape ({math.prod(out)},) (one factor per output), "
                    f"got a {type(scale).__name__} of shape {shape_str(tuple(scale.shape))}"
                )
            if normalize:
                raise ValueError("give normalize=True or an explicit scale, not both")
        self.weights = weights
        self.normalize = bool(normalize)
        self.scale = scale

    # --- shape and placement ---------------------------------------------------------------
    @property
    def shape(self) -> tuple[int, ...]:
        geo = self.geometry
        K = geo.taps if self.weights is None else int(self.weights.shape[0])
        return (K, math.prod(geo.grid), math.prod(geo.out_grid))

    @property
    def backend(self) -> str:
        return self._impl.name

    @property
    def dtype(self) -> Any:
        return self._dtype

    @property
    def device(self) -> str:
        return self._device

    @property
    def grid(self) -> tuple[int, ...]:
        """Input grid sizes."""
        return self.geometry.grid

    @property
    def out_grid(self) -> tuple[int, ...]:
        """Output grid sizes."""
        return self.geometry.out_grid

    @property
    def offsets(self) -> np.ndarray:
        """The ``(J, d)`` tap offsets (a copy)."""
        return self.geometry.offsets.copy()

    @property
    def stride(self) -> tuple[int, ...]:
        return self.geometry.stride

    @property
    def boundary(self) -> str:
        return self.geometry.boundary

    @property
    def placement_free(self) -> bool:
        """Whether the basis holds no arrays (only offsets), so that it applies to any float array.

        A convolution basis built without ``like`` (or with one) stores integers only; the engine
        and :func:`~structconv.apply_shifts` then run it on the backend, dtype and device of ``x``
        (:meth:`placed_like`).  A basis with tap weights keeps the placement of its weights.
        """
        return self.weights is None and self.scale is None

    def placed_like(self, x: object) -> GridBasis:
        """This basis on the backend, dtype and device of ``x`` if it is :attr:`placement_free`, else itself.

        ``x`` that is not a floating NumPy array or torch tensor leaves the basis as it is (the
        caller's checks then name the problem).  The copy shares the geometry (and its cached
        windows), so adapting costs no arithmetic.
        """
        if not self.placement_free:
            return self
        impl = find(x)
        if impl is None or not impl.is_floating(x):
            return self
        dtype, device = x.dtype, impl.device(x)  # type: ignore[attr-defined]
        if impl is self._impl and device == self._device and dtype == self._dtype:
            return self
        out = object.__new__(GridBasis)
        out.geometry, out.weights, out.normalize, out.scale = self.geometry, None, self.normalize, None
        out._impl, out._dtype, out._device = impl, dtype, device
        return out

    def nbytes(self) -> int:
        """Bytes held by the basis: offsets and tap weights (independent of the grid size)."""
        held = [a for a in (self.weights, self.scale) if a is not None]
        # Both backends' dtypes know their item size; no copy to NumPy is needed (bfloat16 has none).
        return int(self.geometry.offsets.nbytes) + sum(int(math.prod(a.shape) * a.dtype.itemsize) for a in held)

    def plan_key(self) -> tuple[Any, ...]:
        explicit = self.scale is not None
        return (type(self).__name__, self.shape, self.geometry.key, self.weights is None, self.normalize, explicit,
                self.backend)  # fmt: skip

    def __repr__(self) -> str:
        geo = self.geometry
        return (
            f"GridBasis(grid={geo.grid}, out_grid={geo.out_grid}, K={self.K}, taps={geo.taps}, "
            f"stride={geo.stride}, boundary={geo.boundary!r}, backend={self.backend}, dtype={self.dtype})"
        )

    # --- tap weights -----------------------------------------------------------------------
    def tap_weights(self) -> Array:
        """The ``(K, J)`` tap weights (the identity for a convolution basis)."""
        if self.weights is not None:
            return self.weights
        return self._impl.namespace().eye(self.geometry.taps, dtype=self._dtype, device=self._device)

    def column_scale(self) -> Array | None:
        """The ``(N,)`` column scale :math:`c_n` (explicit, or of a normalised basis), else ``None``."""
        if self.scale is not None:
            return self.scale
        if not self.normalize:
            return None
        w = self.tap_weights()
        total = w[0] @ of(w).asarray(self.geometry.valid_counts, w)
        if bool((total == 0).any()):
            raise ValueError(
                "normalize=True but some output reads no in-grid entry (or its weights sum to zero); "
                "reduce the padding or the offsets so that every window touches the grid"
            )
        return 1.0 / total

    def _scaled(self, y: Array) -> Array:
        """Multiply the output-entry axis (``-2``) by the column scale."""
        c = self.column_scale()
        return y if c is None else y * c[:, None]

    # --- value operations ------------------------------------------------------------------
    def to_sparse(self) -> SparseBasis:
        """The same basis as a :class:`~structconv.SparseBasis`.

        A convolution basis stores one entry per in-grid (tap, output) pair, at most ``K·N``;
        a weighted one stores every member's weight on every tap, at most ``K·J·N``.
        """
        geo = self.geometry
        index = geo.tap_index  # (J, N)
        K, J, N = self.K, geo.taps, self.N
        k: np.ndarray
        j: np.ndarray
        n: np.ndarray
        if self.weights is None:  # member k is tap k alone
            j, n = np.meshgrid(np.arange(J), np.arange(N), indexing="ij")
            k = j
        else:
            k, j, n = np.meshgrid(np.arange(K), np.arange(J), np.arange(N), indexing="ij")
        m = index[j, n]
        keep = m >= 0
        coords = np.stack([k[keep], m[keep], n[keep]])
        w = self.tap_weights()
        values = w[as_index(k[keep], w), as_index(j[keep], w)]
        c = self.column_scale()
        if c is not None:
            values = values * c[as_index(n[keep], w)]
        return SparseBasis(as_index(coords, w), values, self.shape)

    def to_dense(self) -> Array:
        return self.to_sparse().to_dense()

    def transpose(self) -> Basis:
        """The transposed basis (a transposed convolution), represented sparsely."""
        return self.to_sparse().transpose()

    def select(self, members: Sequence[int]) -> GridBasis:
        index = _member_list(members)
        geo = self.geometry
        if self.weights is None:
            offsets, weights = geo.offsets[index], None
        else:
            offsets, weights = geo.offsets, self.weights[index]
        return GridBasis(
            geo.grid, geo.out_grid, offsets, stride=geo.stride, boundary=geo.boundary, weights=weights,
            normalize=self.normalize, like=self._like(), scale=self.scale,
        )  # fmt: skip

    def _like(self) -> Array:
        return self._impl.namespace().empty((0,), dtype=self._dtype, device=self._device)

    def to(self, device: Any = None, dtype: Any = None) -> GridBasis:
        move = partial(self._impl.move, what="basis")
        like = move(self._like(), device, dtype)
        weights = None if self.weights is None else move(self.weights, device, dtype)
        scale = None if self.scale is None else move(self.scale, device, dtype)
        geo = self.geometry
        return GridBasis(
            geo.grid, geo.out_grid, geo.offsets, stride=geo.stride, boundary=geo.boundary, weights=weights,
            normalize=self.normalize, like=like, scale=scale,
        )  # fmt: skip

    def energy(self) -> float:
        if self.weights is None and not self.normalize and self.scale is None:
            return float(self.geometry.valid_counts.sum()) / self.N
        return self.to_sparse().energy()

    # --- engine hooks ----------------------------------------------------------------------
    def _depthwise(self) -> bool:
        """Whether weighted taps run as one native depthwise convolution per member.

        Gathering every tap first writes ``J`` copies of the input (a Gaussian head of radius 4
        on a 32x32 grid: 50 taps, 4 GB for 9 heads at width 400 and batch 2); the depthwise
        convolution reads the input once per member.
        """
        return self.weights is not None and self.native_available()

    def apply_each(self, x: Array) -> Array:
        if self._depthwise():
            return self._scaled(self._impl.native_depthwise(x, self.weights, self.geometry))
        taps = gather_taps(x, self.geometry)
        if self.weights is not None:
            taps = einsum("kj,bjnc->bknc", self.weights, taps)
        return self._scaled(taps)

    def apply_members(self, s: Array, reduce: bool) -> Array:
        B, K, _, C = (int(v) for v in s.shape)
        geo = self.geometry
        if K == 1 and self._depthwise():
            out = self._scaled(self._impl.native_depthwise(s[:, 0], self.weights, geo))
            return out[:, 0] if reduce else out
        if self.weights is None:  # member k is tap k
            out = gather_taps(s, geo, diagonal=True)
            out = out.sum(1) if reduce else out
        elif reduce:  # sum_k A_k^T s_k = sum_j tap_j(sum_k w_kj s_k)
            out = gather_taps(einsum("kj,bkmc->bjmc", self.weights, s), geo, diagonal=True).sum(1)
        else:
            taps = gather_taps(s.reshape(B * K, self.M, C), geo).reshape(B, K, geo.taps, self.N, C)
            out = einsum("kj,bkjnc->bknc", self.weights, taps)
        return self._scaled(out)

    def cost_each(self, batch: int, channels: int) -> Cost:
        J = self.geometry.taps
        if self._depthwise():
            return self._cost_depthwise(batch, channels)
        flops = 0.0 if self.weights is None else 2.0 * batch * self.K * J * self.N * channels
        return Cost(flops, float(batch * (J + (self.weights is not None) * self.K) * self.N * channels))

    def _cost_depthwise(self, batch: int, channels: int) -> Cost:
        # A depthwise convolution reads a window per output: memory-bound, priced as irregular flops.
        flops = 2.0 * batch * self.K * self.geometry.box_volume * self.N * channels
        return Cost(0.0, float(batch * self.K * self.N * channels), flops)

    def cost_members(self, batch: int, channels: int, reduce: bool) -> Cost:
        J, K, N = self.geometry.taps, self.K, self.N
        if K == 1 and self._depthwise():
            return self._cost_depthwise(batch, channels)
        if self.weights is None:  # one gather per member, then a sum
            return Cost(float(batch * K * N * channels) * reduce, float(batch * K * N * channels))
        mix = 2.0 * batch * K * J * self.M * channels if reduce else 2.0 * batch * K * J * N * channels
        return Cost(mix, float(batch * (J if reduce else K * J) * N * channels))

    # --- whole orders ------------------------------------------------------------------------
    def native_available(self) -> bool:
        """Whether the backend's native convolution runs this basis (torch's ``F.conv{1,2,3}d``: ``d <= 3``)."""
        return self.geometry.ndim <= self._impl.native_stencil_ndim()

    @property
    def entry_shapes(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """``(grid, out_grid)``: the layout of ``x`` and ``y`` in the ``"channels_first"`` layout."""
        return self.geometry.grid, self.geometry.out_grid

    def own_orders(self) -> Mapping[str, OwnOrder]:
        """``"native"`` where the backend has it; at unit stride ``"ax"``/``"xtheta"`` as fused shifts and GEMMs.

        The native order takes a :class:`~structconv.ConvWeight` as it is stored (and fuses a
        bias) when the members are exactly a plain box kernel: unit taps in row-major order, no
        normalisation or scale.
        """
        plain = self.weights is None and not self.normalize and self.scale is None and self.geometry.is_full_box
        native = self.native_available()
        return _GRID_ORDERS[native, self.geometry.unit_stride, native and plain]

    def _tap_thetas(self, theta: Array) -> Array:
        r""":math:`\Theta'_j = \sum_k w_{kj}\Theta_k`: the parameter seen by each tap."""
        return theta if self.weights is None else einsum("kj,kpq->jpq", self.weights, theta)

    def _run_native(self, x: Array, theta: Array) -> Array:
        return self._scaled(self._impl.native_stencil(x, self._tap_thetas(theta), self.geometry))

    def _box_kernel(self, shape: tuple[int, ...]) -> tuple[int, ...] | None:
        """A weight of ``shape`` ``(Q, P/G, *kernel)`` as a kernel over the box, or ``None`` if it is one.

        The members are the box's taps in row-major order, as a :class:`~structconv.ConvWeight`
        numbers its kernel's entries, so a kernel of another shape with as many entries is the
        same map, reshaped.
        """
        box = tuple(self.geometry.box[2])
        return None if tuple(shape[2:]) == box else (*shape[:2], *box)

    def _run_image(self, x: Array, weight: Array, groups: int, bias: Array | None) -> Array:
        box = self._box_kernel(tuple(int(s) for s in weight.shape))
        weight = weight if box is None else weight.reshape(box)
        return self._impl.native_image(x, weight, self.geometry, bias, groups)

    def _bind_image(self, groups: int, shape: tuple[int, ...]) -> Callable[[Array, Array, Array | None], Array]:
        run = self._impl.bind_native_image(self.geometry, groups)
        box = self._box_kernel(shape)
        return run if box is None else lambda x, weight, bias: run(x, weight.reshape(box), bias)

    def _run_shift_ax(self, x: Array, theta: Array) -> Array:
        return self._scaled(shift_then_gemm(x, self._tap_thetas(theta), self.geometry))

    def _run_shift_xtheta(self, x: Array, theta: Array) -> Array:
        return self._scaled(gemm_then_shift(x, self._tap_thetas(theta), self.geometry))

    def _cost(self, batch: int, p: int, q: int, order: str) -> Cost:
        """The cost of an own order: ``"native"``, or the fused shifts of ``"ax"`` and ``"xtheta"``."""
        geo, J, N = self.geometry, self.geometry.taps, self.N
        mix = Cost() if self.weights is None else Cost(2.0 * self.K * J * p * q, float(J * p * q))  # _tap_thetas
        if order == "native":
            padded = math.prod(g + a + b for g, a, b in zip(geo.grid, *geo.reach, strict=True))
            copy = 0.0 if geo.boundary == "zero" and geo.reach[0] == geo.reach[1] else float(batch * padded * p)
            return mix + Cost(2.0 * batch * N * geo.box_volume * p * q, float(batch * N * q) + copy)
        layout, _ = flat_layout(geo)
        rows = float(layout.rows(batch) + layout.lead + layout.tail)
        written = rows * (p + q) + batch * N * q + (order == "xtheta") * rows * J * q
        return mix + Cost(2.0 * rows * J * p * q, written)


# The own orders of a grid basis by (native convolution available, unit stride, plain box kernel), built once.
_NATIVE_COST = partial(GridBasis._cost, order="native")
_NATIVE = {"native": OwnOrder(_NATIVE_COST, GridBasis._run_native)}
_NATIVE_IMAGE = {
    "native": OwnOrder(
        _NATIVE_COST, GridBasis._run_native, run_image=GridBasis._run_image, bind_image=GridBasis._bind_image
    )
}
_SHIFTS = {
    "ax": OwnOrder(partial(GridBasis._cost, order="ax"), GridBasis._run_shift_ax),
    "xtheta": OwnOrder(partial(GridBasis._cost, order="xtheta"), GridBasis._run_shift_xtheta),
}
_GRID_ORDERS: dict[tuple[int, int, int], Mapping[str, OwnOrder]] = {
    (n, u, p): {**((_NATIVE_IMAGE if p else _NATIVE) if n else {}), **(_SHIFTS if u else {})}
    for n in (0, 1)
    for u in (0, 1)
    for p in (0, 1)
}
