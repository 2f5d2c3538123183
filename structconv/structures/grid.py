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
along either side of the triangle, sparsely, or densely.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..backend import Array, device_of, dtype_name, einsum, is_torch, shape_str, to_numpy
from ..bases.base import Basis, Cost
from ..bases.shift import Geometry, gather_taps, gemm_then_shift, shift_then_gemm
from ..bases.sparse import SparseBasis

Size = int | Sequence[int]
Padding = str | int | Sequence[int] | Sequence[Sequence[int]]

BOUNDARIES = ("zero", "periodic")


# --- argument normalisation ---------------------------------------------------------------------
def _ints(value: Size, d: int | None, arg: str, minimum: int) -> tuple[int, ...]:
    """``value`` as a tuple of ``d`` integers ``>= minimum`` (an int is repeated)."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer | Sequence | np.ndarray):
        raise TypeError(f"{arg} must be an int or a sequence of ints, got {type(value).__name__}")
    items = [value] * (d or 1) if isinstance(value, int | np.integer) else list(value)
    if d is not None and len(items) != d:
        raise ValueError(f"{arg} must have {d} entries (one per grid dimension), got {len(items)}: {value!r}")
    if not items:
        raise ValueError(f"{arg} must have at least one entry")
    out = []
    for v in items:
        if isinstance(v, bool) or not isinstance(v, int | np.integer):
            raise TypeError(f"{arg} must hold integers, got {v!r}")
        if v < minimum:
            what = "positive" if minimum == 1 else "non-negative"
            raise ValueError(f"{arg} must be {what}, got {value!r}")
        out.append(int(v))
    return tuple(out)


def _grid(grid: Size) -> tuple[int, ...]:
    return _ints(grid, None, "grid", 1)


def _check_boundary(boundary: str) -> None:
    if boundary not in BOUNDARIES:
        raise ValueError(f"boundary must be one of {BOUNDARIES}, got {boundary!r}")


def _padding(
    padding: Padding, extent: tuple[int, ...], stride: tuple[int, ...]
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Padding before and after, per dimension, from torch-style arguments."""
    d = len(extent)
    if isinstance(padding, str):
        if padding == "valid":
            return (0,) * d, (0,) * d
        if padding == "same":
            if any(s != 1 for s in stride):
                raise ValueError(f"padding='same' needs stride 1 (as in torch), got stride={stride}")
            total = tuple(e - 1 for e in extent)
            before = tuple(t // 2 for t in total)
            return before, tuple(t - b for t, b in zip(total, before, strict=True))
        raise ValueError(f"padding must be 'same', 'valid', an int or a sequence, got {padding!r}")
    items: list[Any] = list(padding) if isinstance(padding, Sequence) else []
    if items and all(isinstance(p, Sequence) for p in items):
        if len(items) != d or any(len(p) != 2 for p in items):
            raise ValueError(f"padding given as pairs must be {d} (before, after) pairs, got {padding!r}")
        before = _ints([p[0] for p in items], d, "padding", 0)
        after = _ints([p[1] for p in items], d, "padding", 0)
        return before, after
    sym = _ints(padding, d, "padding", 0)  # type: ignore[arg-type]
    return sym, sym


def _placement(like: Array | None) -> tuple[str, Any, str]:
    if like is None:
        return "numpy", np.dtype(np.float64), "cpu"
    if is_torch(like):
        if not like.is_floating_point():
            raise TypeError(f"like must hold floating-point numbers (a basis is floating), got dtype {like.dtype}")
        return "torch", like.dtype, str(like.device)
    if isinstance(like, np.ndarray):
        if not np.issubdtype(like.dtype, np.floating):
            raise TypeError(f"like must hold floating-point numbers (a basis is floating), got dtype {like.dtype}")
        return "numpy", like.dtype, "cpu"
    raise TypeError(f"like must be a numpy.ndarray or a torch.Tensor (or None), got {type(like).__name__}")


# --- the basis --------------------------------------------------------------------------------------
class GridBasis(Basis):
    r"""A structured shift basis: :math:`A_{k,mn} = c_n \sum_j w_{kj}\,\mathbb 1[m = s\odot n + o_j]`.

    Build it with :func:`grid_basis`, :func:`avg_pool_basis` or :func:`shift_matrix`.  It holds
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

    __slots__ = ("_backend", "_device", "_dtype", "geometry", "normalize", "scale", "weights")
    representation = "shift"

    def __init__(
        self,
        grid: Size,
        out_grid: Size,
        offsets: Any,
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
            from ..backend.checks import check_array

            check_array(weights, "weights", (2,), ("(K, J)",))
        self._backend, self._dtype, self._device = _placement(weights if weights is not None else like)
        if weights is not None and (weights.ndim != 2 or tuple(weights.shape)[1:] != (off.shape[0],)):
            raise ValueError(
                f"weights must have shape (K, {off.shape[0]}) (one weight per member and tap), "
                f"got {shape_str(tuple(weights.shape))}"
            )
        members = off.shape[0] if weights is None else int(weights.shape[0])
        if normalize and members != 1:
            raise ValueError("normalize=True needs a single member (K=1); concat single-member bases for more")
        if scale is not None:
            from ..backend.checks import check_array

            if check_array(scale, "scale", (1,), ("(N,)",)) != self._backend or int(scale.shape[0]) != math.prod(out):
                raise ValueError(
                    f"scale must be a {self._backend} array of shape ({math.prod(out)},) (one factor per output), "
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
        return self._backend

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
        and :func:`apply_shifts` then run it on the backend, dtype and device of ``x``
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
        if is_torch(x):
            if not x.is_floating_point():  # type: ignore[attr-defined]
                return self
            backend, dtype, device = "torch", x.dtype, str(x.device)  # type: ignore[attr-defined]
        elif isinstance(x, np.ndarray) and np.issubdtype(x.dtype, np.floating):
            backend, dtype, device = "numpy", x.dtype, "cpu"
        else:
            return self
        if backend == self._backend and device == self._device and dtype == self._dtype:
            return self
        out = object.__new__(GridBasis)
        out.geometry, out.weights, out.normalize, out.scale = self.geometry, None, self.normalize, None
        out._backend, out._dtype, out._device = backend, dtype, device
        return out

    def nbytes(self) -> int:
        """Bytes held by the basis: offsets and tap weights (independent of the grid size)."""
        w = (
            0
            if self.weights is None
            else int(self.weights.numel() * self.weights.element_size())
            if is_torch(self.weights)
            else int(self.weights.nbytes)
        )
        c = 0 if self.scale is None else int(to_numpy(self.scale).nbytes)
        return int(self.geometry.offsets.nbytes) + w + c

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
        J = self.geometry.taps
        if self._backend == "torch":
            import torch

            return torch.eye(J, dtype=self._dtype, device=self._device)
        return np.eye(J, dtype=self._dtype)

    def column_scale(self) -> Array | None:
        """The ``(N,)`` column scale :math:`c_n` (explicit, or of a normalised basis), else ``None``."""
        if self.scale is not None:
            return self.scale
        if not self.normalize:
            return None
        w = self.tap_weights()
        valid = self.geometry.valid_counts.astype(to_numpy(w).dtype if not is_torch(w) else np.float64)
        if is_torch(w):
            import torch

            total = w[0] @ torch.as_tensor(valid, dtype=w.dtype, device=w.device)
            empty = bool((total == 0).any())
        else:
            total = w[0] @ valid
            empty = bool((total == 0).any())
        if empty:
            raise ValueError(
                "normalize=True but some output reads no in-grid entry (or its weights sum to zero); "
                "reduce the padding or the offsets so that every window touches the grid"
            )
        return 1.0 / total

    def _scaled(self, y: Array, axis_from_end: int = 2) -> Array:
        """Multiply the output-entry axis (``-axis_from_end``) by the column scale."""
        c = self.column_scale()
        if c is None:
            return y
        shape = [1] * y.ndim
        shape[y.ndim - axis_from_end] = self.N
        return y * c.reshape(shape)

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
        if is_torch(w):
            import torch

            jj, nn_ = torch.as_tensor(j[keep], device=w.device), torch.as_tensor(n[keep], device=w.device)
            values = w[torch.as_tensor(k[keep], device=w.device), jj]
            c = self.column_scale()
            if c is not None:
                values = values * c[nn_]
            return SparseBasis(torch.as_tensor(coords, device=w.device), values, self.shape)
        values = w[k[keep], j[keep]]
        c = self.column_scale()
        if c is not None:
            values = values * c[n[keep]]
        return SparseBasis(coords, values, self.shape)

    def to_dense(self) -> Array:
        return self.to_sparse().to_dense()

    def transpose(self) -> Basis:
        """The transposed basis (a transposed convolution), represented sparsely."""
        return self.to_sparse().transpose()

    def select(self, members: Sequence[int]) -> GridBasis:
        index = list(members)
        if not index:
            raise ValueError("members must name at least one basis member")
        geo = self.geometry
        if self.weights is None:
            offsets, weights = geo.offsets[index], None
        else:
            offsets, weights = geo.offsets, self.weights[index]
        return GridBasis(
            geo.grid, geo.out_grid, offsets, geo.stride, geo.boundary, weights, self.normalize, self._like(), self.scale
        )

    def _like(self) -> Array:
        if self._backend == "torch":
            import torch

            return torch.empty(0, dtype=self._dtype, device=self._device)
        return np.empty(0, dtype=self._dtype)

    def to(self, device: Any = None, dtype: Any = None) -> GridBasis:
        like = self._like()
        if is_torch(like):
            like = like.to(device=device, dtype=dtype)
        else:
            if device not in (None, "cpu"):
                raise ValueError(f"device={device!r}: a NumPy basis lives on the CPU; build it with a torch `like`")
            like = like if dtype is None else like.astype(dtype)
        weights = self.weights
        if weights is not None:
            weights = weights.to(device=device, dtype=dtype) if is_torch(weights) else weights.astype(like.dtype)
        scale = self.scale
        if scale is not None:
            scale = scale.to(device=device, dtype=dtype) if is_torch(scale) else scale.astype(like.dtype)
        geo = self.geometry
        return GridBasis(
            geo.grid, geo.out_grid, geo.offsets, geo.stride, geo.boundary, weights, self.normalize, like, scale
        )

    def energy(self) -> float:
        if self.weights is None and not self.normalize and self.scale is None:
            return float(self.geometry.valid_counts.sum()) / self.N
        return self.to_sparse().energy()

    # --- engine hooks ----------------------------------------------------------------------
    def apply_each(self, x: Array) -> Array:
        taps = gather_taps(x, self.geometry)
        if self.weights is not None:
            taps = einsum("kj,bjnc->bknc", self.weights, taps)
        return self._scaled(taps)

    def apply_members(self, s: Array, reduce: bool) -> Array:
        B, K, _, C = (int(v) for v in s.shape)
        geo = self.geometry
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
        flops = 0.0 if self.weights is None else 2.0 * batch * self.K * J * self.N * channels
        return Cost(flops, float(batch * (J + (self.weights is not None) * self.K) * self.N * channels))

    def cost_members(self, batch: int, channels: int, reduce: bool) -> Cost:
        J, K, N = self.geometry.taps, self.K, self.N
        if self.weights is None:  # one gather per member, then a sum
            return Cost(float(batch * K * N * channels) * reduce, float(batch * K * N * channels))
        mix = 2.0 * batch * K * J * self.M * channels if reduce else 2.0 * batch * K * J * N * channels
        return Cost(mix, float(batch * (J if reduce else K * J) * N * channels))

    # --- whole orders ------------------------------------------------------------------------
    def native_available(self) -> bool:
        """Whether a native ``F.conv{1,2,3}d`` call can run this basis (torch, ``d <= 3``)."""
        return self._backend == "torch" and self.geometry.ndim <= 3

    def special_orders(self) -> tuple[str, ...]:
        return ("native",) if self.native_available() else ()

    def _tap_thetas(self, theta: Array) -> Array:
        r""":math:`\Theta'_j = \sum_k w_{kj}\Theta_k`: the parameter seen by each tap."""
        return theta if self.weights is None else einsum("kj,kpq->jpq", self.weights, theta)

    def run_order(self, order: str, x: Array, theta: Array) -> Array | None:
        geo = self.geometry
        if order == "native":
            from ..backend.shift_torch import native_conv

            return self._scaled(native_conv(x, self._tap_thetas(theta), geo))
        if order in ("ax", "xtheta") and geo.unit_stride:
            fused = shift_then_gemm if order == "ax" else gemm_then_shift
            return self._scaled(fused(x, self._tap_thetas(theta), geo))
        return None

    def cost_order(self, order: str, batch: int, p: int, q: int) -> Cost | None:
        geo = self.geometry
        J, K, N = geo.taps, self.K, self.N
        mix = Cost() if self.weights is None else Cost(2.0 * K * J * p * q, float(J * p * q))
        if order == "native":
            padded = math.prod(g + a + b for g, a, b in zip(geo.grid, *geo.reach, strict=True))
            copy = 0.0 if geo.boundary == "zero" and geo.reach[0] == geo.reach[1] else float(batch * padded * p)
            return mix + Cost(2.0 * batch * N * geo.box_volume * p * q, float(batch * N * q) + copy)
        if order in ("ax", "xtheta") and geo.unit_stride:
            from ..bases.shift import flat_layout

            layout, _ = flat_layout(geo)
            rows = float(layout.rows(batch) + layout.lead + layout.tail)
            written = rows * (p + q) + batch * N * q
            if order == "xtheta":
                written += rows * J * q
            return mix + Cost(2.0 * rows * J * p * q, written)
        return None


# --- constructors -------------------------------------------------------------------------------
def _window_offsets(kernel: Size, dilation: Size, d: int) -> np.ndarray:
    k = _ints(kernel, d, "kernel", 1)
    dil = _ints(dilation, d, "dilation", 1)
    return np.indices(k).reshape(d, -1).T.astype(np.int64) * np.asarray(dil, dtype=np.int64)


def _layout_window(
    g: tuple[int, ...], window: np.ndarray, stride: tuple[int, ...], padding: Padding
) -> tuple[tuple[int, ...], np.ndarray]:
    """Output grid and tap offsets of a window placed like torch places a kernel."""
    extent = tuple(int(e) + 1 for e in window.max(0))
    before, after = _padding(padding, extent, stride)
    out = []
    for i, (size, e) in enumerate(zip(g, extent, strict=True)):
        padded = size + before[i] + after[i]
        if padded < e:
            raise ValueError(
                f"kernel spans {e} entries along grid dimension {i} (kernel, dilation or offsets) but the "
                f"padded grid has only {padded} (grid {size} + padding {before[i]} + {after[i]})"
            )
        out.append((padded - e) // stride[i] + 1)
    return tuple(out), window - np.asarray(before, dtype=np.int64)


def grid_basis(
    grid: Size,
    kernel: Size | None = None,
    stride: Size = 1,
    dilation: Size = 1,
    padding: Padding = 0,
    offsets: Any = None,
    boundary: str = "zero",
    like: Array | None = None,
) -> GridBasis:
    r"""The shift basis of a grid convolution (Def. 2), laid out like ``F.conv{1,2,3}d``.

    Member :math:`k` is the :math:`k`-th kernel position in row-major order, so that with
    ``theta = weight.flatten(2).permute(2, 1, 0)``, ``conv(grid_basis(...), x, theta)`` equals
    ``F.conv{d}d`` with the same stride, padding and dilation (``x`` flattened row-major to
    ``(B, M, P)``).

    Parameters
    ----------
    grid
        Input grid sizes :math:`(S_1, \dots, S_d)` (an int for a 1-D sequence).
    kernel
        Kernel sizes (an int is used along every dimension).  Give either ``kernel`` or
        ``offsets``.
    stride, dilation
        Positive ints or per-dimension tuples.
    padding
        ``"valid"``, ``"same"`` (stride 1 only; an odd total is split with the extra entry
        after, as torch does), an int, a per-dimension tuple, or per-dimension
        ``(before, after)`` pairs.
    offsets
        An irregular kernel: ``(K, d)`` integer positions of the kernel entries (e.g. a cross).
        They are placed inside their bounding window, which padding and "same" then treat like
        a kernel of that size.  ``kernel`` and ``dilation`` must be left unset.
    boundary
        ``"zero"`` (torch's zero padding) or ``"periodic"`` (reads wrap around the grid, like
        ``padding_mode="circular"``).
    like
        An array whose backend, dtype and device the basis reports (default NumPy float64).  The
        basis holds offsets only (:attr:`GridBasis.placement_free`), so it runs on any floating
        ``x`` whatever ``like`` says; an integer ``like`` is refused.

    Returns
    -------
    GridBasis
        Shape ``(K, M, N)`` with :math:`M = \prod_i S_i` and :math:`N` the output grid volume.

    Raises
    ------
    ValueError, TypeError
        For non-positive sizes, strides or dilations, negative or malformed padding,
        ``"same"`` with a stride, or a kernel larger than the padded grid.

    Examples
    --------
    >>> import torch
    >>> from structconv import conv, grid_basis
    >>> x, weight = torch.randn(2, 3, 8, 8), torch.randn(5, 3, 3, 3)
    >>> A = grid_basis((8, 8), 3, padding=1, like=x)
    >>> A.shape
    (9, 64, 64)
    >>> y = conv(A, x.flatten(2).transpose(1, 2), weight.flatten(2).permute(2, 1, 0))
    >>> ref = torch.nn.functional.conv2d(x, weight, padding=1)
    >>> torch.allclose(y.transpose(1, 2).reshape(2, 5, 8, 8), ref, atol=1e-5)
    True
    """
    g = _grid(grid)
    d = len(g)
    st = _ints(stride, d, "stride", 1)
    _check_boundary(boundary)
    if offsets is None:
        if kernel is None:
            raise ValueError("give kernel (a window size) or offsets (an irregular kernel)")
        window = _window_offsets(kernel, dilation, d)
    else:
        if kernel is not None or _ints(dilation, d, "dilation", 1) != (1,) * d:
            raise ValueError("offsets replaces kernel and dilation; leave them unset")
        window = np.asarray(offsets)
        if window.ndim != 2 or window.shape[1] != d or window.shape[0] == 0:
            raise ValueError(f"offsets must have shape (K, {d}), got {window.shape}")
        if not np.issubdtype(window.dtype, np.integer):
            raise TypeError(f"offsets must hold integers, got dtype {window.dtype}")
        if len({tuple(r) for r in window.tolist()}) != len(window):
            raise ValueError("offsets must be distinct kernel positions")
        window = window.astype(np.int64) - window.min(0)
    out, taps = _layout_window(g, window, st, padding)
    return GridBasis(g, out, taps, st, boundary, like=like)


def avg_pool_basis(
    grid: Size,
    kernel: Size,
    stride: Size | None = None,
    padding: Padding = 0,
    count_include_pad: bool = True,
    boundary: str = "zero",
    like: Array | None = None,
    ceil_mode: bool = False,
) -> GridBasis:
    r"""Average pooling as a one-member basis: :math:`A = \frac1{|W|}\sum_{o \in W}\mathcal A_{-o}` (strided).

    With :math:`\Theta = I` (channel by channel), :math:`A^\top x` equals ``F.avg_pool{d}d`` with
    the same kernel, stride (default: the kernel) and padding.  ``count_include_pad=False``
    divides by the in-grid entries of each window instead (a normalised basis).

    ``like`` gives the backend, dtype and device of the tap weights (default NumPy float64).
    ``ceil_mode=True`` is torch's rule: along each dimension
    :math:`N_i = \lceil (S_i + p_i + p'_i - k_i)/s_i \rceil + 1`, less one if the last window
    would start past the input (at or after :math:`S_i + p_i` in padded coordinates), so every
    window starts inside the input or the left padding.  Windows may then run past the right
    padding; those reads are missing entries, and the divisor is what torch divides by: with
    ``count_include_pad`` the window's entries inside the padded grid
    :math:`\prod_i (\min(t_i + k_i, S_i + p'_i) - t_i)` (:math:`t_i = s_i n_i - p_i`, an
    explicit column scale), otherwise its in-grid entries.

    Examples
    --------
    >>> import torch
    >>> from structconv import apply_shifts, avg_pool_basis
    >>> x = torch.randn(2, 3, 8, 8)
    >>> A = avg_pool_basis((8, 8), 2, like=x)
    >>> y = apply_shifts(A, x.flatten(2).transpose(1, 2))[:, 0]  # (B, N, C)
    >>> torch.allclose(y.transpose(1, 2).reshape(2, 3, 4, 4), torch.nn.functional.avg_pool2d(x, 2))
    True
    """
    g = _grid(grid)
    d = len(g)
    k = _ints(kernel, d, "kernel", 1)
    st = k if stride is None else _ints(stride, d, "stride", 1)
    if isinstance(padding, str):
        raise ValueError(f"padding must be an int, a per-dimension tuple or (before, after) pairs, got {padding!r}")
    before, after = _padding(padding, k, st)
    if any(2 * p > size for p, size in zip(before + after, k + k, strict=True)):
        raise ValueError(f"padding must be at most half the kernel {k} (as in torch), got {padding!r}")
    if ceil_mode:
        out, taps, counts = _ceil_layout(g, k, st, before, after)
    else:
        out, taps = _layout_window(g, _window_offsets(k, 1, d), st, padding)
        counts = None
    J = taps.shape[0]
    value = 1.0 if not count_include_pad else 1.0 / J
    backend, dtype, device = _placement(like)
    scale: Array | None = None
    uneven = count_include_pad and counts is not None and bool((counts != J).any())
    if backend == "torch":
        import torch

        weights: Array = torch.full((1, J), value, dtype=dtype, device=device)
        if uneven:
            scale = torch.as_tensor(J / counts, dtype=dtype, device=device)
    else:
        weights = np.full((1, J), value, dtype=dtype)
        if uneven:
            scale = (J / counts).astype(dtype)
    return GridBasis(g, out, taps, st, boundary, weights=weights, normalize=not count_include_pad, scale=scale)


def _ceil_layout(
    g: tuple[int, ...], k: tuple[int, ...], st: tuple[int, ...], before: tuple[int, ...], after: tuple[int, ...]
) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
    """Output grid, tap offsets and per-output padded-grid window counts of torch's ``ceil_mode`` pooling."""
    out, sides = [], []
    for i, (size, kk, s, b, a) in enumerate(zip(g, k, st, before, after, strict=True)):
        n = -(-(size + b + a - kk) // s) + 1
        if (n - 1) * s >= size + b:  # the last window must start inside the input or the left padding
            n -= 1
        if n < 1:
            raise ValueError(
                f"kernel {kk} leaves no output along grid dimension {i} (grid {size}, padding {b} + {a}, stride {s})"
            )
        start = np.arange(n) * s - b
        sides.append(np.minimum(start + kk, size + a) - start)  # window entries inside the padded grid
        out.append(n)
    counts = sides[0].astype(np.float64)
    for side in sides[1:]:
        counts = np.multiply.outer(counts, side)
    taps = _window_offsets(k, 1, len(g)) - np.asarray(before, dtype=np.int64)
    return tuple(out), taps, counts.reshape(-1)


def shift_matrix(grid: Size, d: Size, boundary: str = "zero", like: Array | None = None) -> GridBasis:
    r"""The shift matrix :math:`\mathcal A_{\mathbf d}` of Def. 1 as a one-member basis.

    :math:`(\mathcal A_{\mathbf d})_{mn} = 1` iff grid position :math:`n` minus position
    :math:`m` is :math:`\mathbf d` (row-major flattening), i.e. output :math:`n` reads input
    :math:`n - \mathbf d`; with ``boundary="periodic"`` positions wrap around.

    Examples
    --------
    >>> from structconv import shift_matrix
    >>> shift_matrix(4, 1).to_dense()[0].astype(int)
    array([[0, 1, 0, 0],
           [0, 0, 1, 0],
           [0, 0, 0, 1],
           [0, 0, 0, 0]])
    """
    g = _grid(grid)
    if isinstance(d, int | np.integer):
        shift = (int(d),) * len(g) if len(g) == 1 else None
    else:
        shift = tuple(int(v) for v in d)
    if shift is None or len(shift) != len(g):
        raise ValueError(f"d must have one entry per grid dimension ({len(g)}), got {d!r}")
    return GridBasis(g, g, -np.asarray([shift], dtype=np.int64), 1, boundary, like=like)


def apply_shifts(basis: GridBasis, x: Array, method: str = "auto") -> Array:
    r""":math:`A_k^\top x` for every member, channel by channel: ``(B, M, C) -> (B, K, N, C)``.

    This is the "A·x" side of the triangle with :math:`\Theta = I` per channel, the whole of a
    pooling layer (so no identity GEMM is spent).  ``method`` is ``"native"`` (``F.avg_pool*d``
    or a depthwise ``F.conv*d``, torch only), ``"shift"`` (slicing), or ``"auto"`` (native when
    available).
    """
    if not isinstance(basis, GridBasis):
        raise TypeError(f"basis must be a GridBasis, got {type(basis).__name__}")
    if method not in ("auto", "native", "shift"):
        raise ValueError(f"method must be 'auto', 'native' or 'shift', got {method!r}")
    from ..backend.checks import check_array

    backend = check_array(x, "x", (3,), ("(B, M, C)",))
    basis = basis.placed_like(x)
    if (
        backend != basis.backend
        or dtype_name(x) != str(basis.dtype).removeprefix("torch.")
        or device_of(x) != basis.device
    ):
        raise TypeError(
            f"x is a {backend} {dtype_name(x)} array on {device_of(x)} but the basis is {basis.backend} "
            f"{basis.dtype} on {basis.device}; build the basis with like=x"
        )
    if int(x.shape[1]) != basis.M:
        raise ValueError(f"x has {int(x.shape[1])} entries (dim 1) but the basis grid {basis.grid} has M={basis.M}")
    if method == "native" and not basis.native_available():
        raise ValueError("method='native' needs a torch basis on a 1-, 2- or 3-D grid")
    if method == "shift" or not basis.native_available():
        return basis.apply_each(x)
    from ..backend.shift_torch import native_depthwise

    return basis._scaled(native_depthwise(x, basis.tap_weights(), basis.geometry))
