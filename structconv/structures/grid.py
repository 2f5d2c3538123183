r"""Builders of grid bases: convolutions, average pooling and shift matrices (Andreoli, §2.1, Def. 1–2).

Each builder turns torch-style layer arguments (kernel, stride, dilation, padding, an irregular
kernel's offsets, ``ceil_mode``) into the tap offsets and output grid of a
:class:`~structconv.GridBasis` (the representation, in ``structconv.bases.grid``), placing the
window as torch places a kernel.  :func:`apply_shifts` evaluates :math:`A_k^\top x` channel by
channel, the whole of a pooling layer.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..backend import Array, device_of, dtype_name, of
from ..backend.checks import check_array
from ..bases.grid import BOUNDARIES, GridBasis, Size, _check_boundary, _grid, _ints, _placement
from ..bases.grid_args import _INT64_MAX

__all__ = [
    "BOUNDARIES",
    "GridBasis",
    "Padding",
    "apply_shifts",
    "avg_pool_basis",
    "grid_basis",
    "shift_matrix",
]

Padding = str | int | Sequence[int] | Sequence[Sequence[int]]


# --- argument normalisation ---------------------------------------------------------------------
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


# --- constructors -------------------------------------------------------------------------------
#: The most kernel positions a builder lays out: the tap table is built before any data is seen,
#: so a size typed by mistake (``kernel=10**6`` on a 3-D grid) must stop here, not in the allocator.
MAX_TAPS = 1 << 24


def _window_offsets(kernel: Size, dilation: Size, d: int) -> np.ndarray:
    """The taps of a dense ``kernel`` window with ``dilation``, refused before allocating if implausibly many."""
    k = _ints(kernel, d, "kernel", 1)
    dil = _ints(dilation, d, "dilation", 1)
    taps = math.prod(k)
    if taps > MAX_TAPS:
        raise ValueError(
            f"kernel {k} has {taps:,} positions; its tap table would need {taps * d * 8 / 2**30:.3g} GiB "
            f"(at most {MAX_TAPS:,} positions are laid out)"
        )
    return np.indices(k).reshape(d, -1).T.astype(np.int64) * np.asarray(dil, dtype=np.int64)


def _window_extent(kernel: Size, dilation: Size, d: int) -> tuple[int, ...]:
    """Entries a dense window spans per dimension, :math:`(k_i - 1) d_i + 1`, computed without building it."""
    k = _ints(kernel, d, "kernel", 1)
    dil = _ints(dilation, d, "dilation", 1)
    return tuple((ki - 1) * di + 1 for ki, di in zip(k, dil, strict=True))


def _padded(size: int, before: int, after: int, i: int) -> int:
    """Entries of grid dimension ``i`` once padded, refused beyond int64 (the taps' and output's index type)."""
    padded = size + before + after
    if padded > _INT64_MAX:
        raise ValueError(
            f"padding {before} + {after} makes grid dimension {i} (size {size}) {padded} entries long, more than "
            "2**63 - 1 (a 64-bit integer)"
        )
    return padded


def _layout_window(
    g: tuple[int, ...], extent: tuple[int, ...], stride: tuple[int, ...], padding: Padding
) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Output grid and padding before of a window spanning ``extent``, placed like torch places a kernel.

    Runs on the extent alone, so a window larger than the padded grid is refused before its taps exist.
    """
    before, after = _padding(padding, extent, stride)
    out = []
    for i, (size, e) in enumerate(zip(g, extent, strict=True)):
        padded = _padded(size, before[i], after[i], i)
        if padded < e:
            raise ValueError(
                f"kernel spans {e} entries along grid dimension {i} (kernel, dilation or offsets) but the "
                f"padded grid has only {padded} (grid {size} + padding {before[i]} + {after[i]})"
            )
        out.append((padded - e) // stride[i] + 1)
    return tuple(out), before


def grid_basis(
    grid: Size,
    kernel: Size | None = None,
    *,
    stride: Size = 1,
    padding: Padding = 0,
    dilation: Size = 1,
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
    stride
        A positive int or a per-dimension tuple: output :math:`n` reads from input position
        :math:`s\odot n` on.
    padding
        ``"valid"``, ``"same"`` (stride 1 only; an odd total is split with the extra entry
        after, as torch does), an int, a per-dimension tuple, or per-dimension
        ``(before, after)`` pairs.
    dilation
        A positive int or a per-dimension tuple: the spacing of the kernel's entries.
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
        extent = _window_extent(kernel, dilation, d)
        out, before = _layout_window(g, extent, st, padding)
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
        out, before = _layout_window(g, tuple(int(e) + 1 for e in window.max(0)), st, padding)
    taps = window - np.asarray(before, dtype=np.int64)
    return GridBasis(g, out, taps, stride=st, boundary=boundary, like=like)


def avg_pool_basis(
    grid: Size,
    kernel: Size,
    *,
    stride: Size | None = None,
    padding: Padding = 0,
    ceil_mode: bool = False,
    count_include_pad: bool = True,
    boundary: str = "zero",
    like: Array | None = None,
) -> GridBasis:
    r"""Average pooling as a one-member basis: :math:`A = \frac1{|W|}\sum_{o \in W}\mathcal A_{-o}` (strided).

    With :math:`\Theta = I` (channel by channel), :math:`A^\top x` equals ``F.avg_pool{d}d`` with
    the same kernel, stride and padding (:func:`apply_shifts` applies it so).

    Parameters
    ----------
    grid
        Input grid sizes :math:`(S_1, \dots, S_d)` (an int for a 1-D sequence).
    kernel
        Window sizes :math:`k_i` (an int is used along every dimension).
    stride
        A positive int or a per-dimension tuple; ``None`` (the default) is the kernel, as in
        torch.
    padding
        An int, a per-dimension tuple or per-dimension ``(before, after)`` pairs, each at most
        half the kernel (as in torch); no ``"same"`` or ``"valid"``.
    ceil_mode
        Torch's rule for the last window: along each dimension
        :math:`N_i = \lceil (S_i + p_i + p'_i - k_i)/s_i \rceil + 1`, less one if the last window
        would start past the input (at or after :math:`S_i + p_i` in padded coordinates), so
        every window starts inside the input or the left padding.  Windows may then run past
        the right padding; those reads are missing entries.
    count_include_pad
        Divide by :math:`|W|`, padded entries included (the default, as torch; with
        ``ceil_mode`` a window's entries inside the padded grid,
        :math:`\prod_i (\min(t_i + k_i, S_i + p'_i) - t_i)` with :math:`t_i = s_i n_i - p_i`, an
        explicit column scale); ``False`` divides by each window's in-grid entries instead (a
        normalised basis).
    boundary
        ``"zero"`` or ``"periodic"``, as for :func:`grid_basis`.
    like
        An array whose backend, dtype and device the tap weights take (default NumPy float64).

    Returns
    -------
    GridBasis
        Shape ``(1, M, N)`` with :math:`M = \prod_i S_i` and :math:`N` the output grid volume.

    Raises
    ------
    ValueError, TypeError
        For non-positive sizes or strides, string or over-large padding, or a window that
        leaves no output.

    Examples
    --------
    >>> import torch
    >>> from structconv import apply_shifts, avg_pool_basis
    >>> x = torch.randn(2, 3, 8, 8)
    >>> A = avg_pool_basis((8, 8), 2, like=x)
    >>> y = apply_shifts(A, x.flatten(2).transpose(1, 2))[:, 0]  # (B, N, C)
    >>> ref = torch.nn.functional.avg_pool2d(x, 2)
    >>> torch.allclose(y.transpose(1, 2).reshape(2, 3, 4, 4), ref)
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
        out, shift = _layout_window(g, k, st, padding)
        taps = _window_offsets(k, 1, d) - np.asarray(shift, dtype=np.int64)
        counts = None
    J = taps.shape[0]
    value = 1.0 if not count_include_pad else 1.0 / J
    backend, dtype, device = _placement(like)
    weights = backend.namespace().full((1, J), value, dtype=dtype, device=device)
    scale: Array | None = None
    if count_include_pad and counts is not None and bool((counts != J).any()):
        scale = backend.asarray(J / counts, weights)
    normalize = not count_include_pad
    return GridBasis(g, out, taps, stride=st, boundary=boundary, weights=weights, normalize=normalize, scale=scale)


def _ceil_layout(
    g: tuple[int, ...], k: tuple[int, ...], st: tuple[int, ...], before: tuple[int, ...], after: tuple[int, ...]
) -> tuple[tuple[int, ...], np.ndarray, np.ndarray]:
    """Output grid, tap offsets and per-output padded-grid window counts of torch's ``ceil_mode`` pooling."""
    out, sides = [], []
    for i, (size, kk, s, b, a) in enumerate(zip(g, k, st, before, after, strict=True)):
        n = -(-(_padded(size, b, a, i) - kk) // s) + 1
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


def shift_matrix(grid: Size, d: Size, *, boundary: str = "zero", like: Array | None = None) -> GridBasis:
    r"""The shift matrix :math:`\mathcal A_{\mathbf d}` of Def. 1 as a one-member basis.

    :math:`(\mathcal A_{\mathbf d})_{mn} = 1` iff grid position :math:`n` minus position
    :math:`m` is :math:`\mathbf d` (row-major flattening), i.e. output :math:`n` reads input
    :math:`n - \mathbf d`.

    Parameters
    ----------
    grid
        Grid sizes :math:`(S_1, \dots, S_d)` (an int for a 1-D sequence); input and output
        share the grid.
    d
        The shift :math:`\mathbf d`, one integer per grid dimension (an int for a 1-D grid).
        Any integers: a shift beyond the grid gives an all-zero matrix under ``"zero"``.
    boundary
        ``"zero"`` (reads outside the grid are zero) or ``"periodic"`` (positions wrap around).
    like
        An array whose backend, dtype and device the basis reports (default NumPy float64).

    Returns
    -------
    GridBasis
        Shape ``(1, M, M)`` with :math:`M = \prod_i S_i`.

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
    if isinstance(d, int | np.integer) and len(g) != 1:
        raise ValueError(f"d must have one entry per grid dimension ({len(g)}), got {d!r}")
    shift = _ints(d, len(g), "d", -(2**62))  # any integer offset; those beyond the grid give an empty matrix
    return GridBasis(g, g, -np.asarray([shift], dtype=np.int64), stride=1, boundary=boundary, like=like)


def apply_shifts(basis: GridBasis, x: Array, *, order: str = "auto") -> Array:
    r""":math:`A_k^\top x` for every member, channel by channel: ``(B, M, C) -> (B, K, N, C)``.

    This is the "A·x" side of the triangle with :math:`\Theta = I` per channel,
    :math:`R_{bknc} = \sum_m A_{kmn} x_{bmc}`: the whole of a pooling layer (so no identity GEMM
    is spent).

    Parameters
    ----------
    basis
        A :class:`GridBasis` of shape ``(K, M, N)``.
    x
        ``(B, M, C)``, floating, with the basis' backend, dtype and device (build the basis
        with ``like=x``).
    order
        How it runs, as :func:`structconv.conv`'s ``order`` says it: ``"native"`` (``F.avg_pool*d``
        or a depthwise ``F.conv*d``, torch on a 1- to 3-D grid only), ``"shift"`` (slicing), or
        ``"auto"`` (native where available).

    Returns
    -------
    Array
        ``(B, K, N, C)``.

    Raises
    ------
    TypeError
        If ``basis`` is not a :class:`GridBasis`, or ``x`` is not placed like it.
    ValueError
        For another ``order``, ``"native"`` where it is not available, or ``x`` of the wrong
        shape.
    """
    if not isinstance(basis, GridBasis):
        raise TypeError(f"basis must be a GridBasis, got {type(basis).__name__}")
    if order not in ("auto", "native", "shift"):
        raise ValueError(f"order must be 'auto', 'native' or 'shift', got {order!r}")
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
    if order == "native" and not basis.native_available():
        raise ValueError("order='native' needs a torch basis on a 1-, 2- or 3-D grid")
    if order == "shift" or not basis.native_available():
        return basis.apply_each(x)
    return basis._scaled(of(x).native_depthwise(x, basis.tap_weights(), basis.geometry))
