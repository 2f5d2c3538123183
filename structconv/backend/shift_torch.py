r"""The torch shift kernels: framing, fused autograd functions and the native convolution calls.

Part of the torch backend (:class:`~structconv.backend.torch.TorchBackend` forwards its grid
methods here; ``structconv.nn``'s grid layers call :func:`conv_image` directly), so it is
imported only once a torch tensor is seen and the NumPy path never imports torch.

:class:`ShiftGemm` and :class:`ShiftAdd` have backward passes of their own, differentiable as
written (``docs/internals.rst``, grid convolution).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from typing import Any

import torch
from torch.nn import functional as F  # noqa: N812 (torch's own convention)

from .stencil import Geometry
from .torch_autocast import autocast_dtype


def _conv3d(x: torch.Tensor, weight: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """``F.conv3d``, run in float32 for 16-bit inputs on the CPU and rounded back.

    torch 2.13's CPU ``conv3d`` in bfloat16 returns wrong values (zeros, or memory never written)
    for some small strided grids, e.g. a (1, 1, 4) kernel with stride (1, 1, 4) on a 2x3x5 grid.
    """
    if x.device.type == "cpu" and x.dtype in (torch.bfloat16, torch.float16):
        bias = args[0] if args else kwargs.pop("bias", None)
        rest = args[1:] if args else ()
        y = F.conv3d(x.float(), weight.float(), None if bias is None else bias.float(), *rest, **kwargs)
        return y.to(x.dtype)
    return F.conv3d(x, weight, *args, **kwargs)


_CONV: dict[int, Callable[..., torch.Tensor]] = {1: F.conv1d, 2: F.conv2d, 3: _conv3d}
_AVG_POOL = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}


def _pad_widths(lo: tuple[int, ...], hi: tuple[int, ...]) -> list[int]:
    """``lo``/``hi`` per axis as ``F.pad`` lists them: the last axis first."""
    return [w for i in reversed(range(len(lo))) for w in (lo[i], hi[i])]


def frame(xg: torch.Tensor, lo: tuple[int, ...], hi: tuple[int, ...], boundary: str) -> torch.Tensor:
    """Pad the grid axes ``1..d`` of ``xg`` (``(B, *grid, C)``) with zeros or, if periodic, wrapped entries.

    Parameters
    ----------
    xg, lo, hi, boundary
        As for :meth:`structconv.backend.interface.Backend.frame`.
    """
    if not any(lo) and not any(hi):
        return xg
    if boundary == "periodic":
        for i in range(len(lo)):
            size = int(xg.shape[1 + i])
            idx = torch.arange(-lo[i], size + hi[i], device=xg.device) % size
            xg = xg.index_select(1 + i, idx)
        return xg
    return F.pad(xg, [0, 0, *_pad_widths(lo, hi)])  # the channel axis, last, is not padded


class ShiftGemm(torch.autograd.Function):
    r""":math:`Y = \sum_j X_{[f_j, f_j + R)}\,\Theta_j` for row shifts :math:`f_j` (forward of the fused A·x order)."""

    @staticmethod
    def forward(ctx: Any, buf: torch.Tensor, thetas: torch.Tensor, shifts: tuple[int, ...], rows: int) -> torch.Tensor:
        y = torch.mm(buf[shifts[0] : shifts[0] + rows], thetas[0])
        for j in range(1, len(shifts)):
            y.addmm_(buf[shifts[j] : shifts[j] + rows], thetas[j])
        ctx.save_for_backward(buf, thetas)
        ctx.shifts, ctx.rows = shifts, rows
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        # Differentiable as written (in-place on slices of a fresh buffer is recorded as copies
        # into slices), so a double backward differentiates this pass itself.
        buf, thetas = ctx.saved_tensors
        shifts, rows = ctx.shifts, ctx.rows
        grad_buf = grad_theta = None
        if ctx.needs_input_grad[0]:
            grad_buf = grad.new_zeros(buf.shape)
            for j, f in enumerate(shifts):
                grad_buf[f : f + rows].addmm_(grad, thetas[j].T)
        if ctx.needs_input_grad[1]:
            grad_theta = torch.stack([buf[f : f + rows].T @ grad for f in shifts])
        return grad_buf, grad_theta, None, None


def shift_gemm(buf: torch.Tensor, thetas: torch.Tensor, shifts: tuple[int, ...], rows: int) -> torch.Tensor:
    """:class:`ShiftGemm` with autocast honoured (its in-place ``addmm_`` is not autocast by torch).

    Parameters
    ----------
    buf, thetas, shifts, rows
        As for :meth:`structconv.backend.interface.Backend.shift_gemm`.
    """
    dtype = autocast_dtype(buf.device.type)
    if dtype is not None:
        buf, thetas = buf.to(dtype), thetas.to(dtype)
    y: torch.Tensor = ShiftGemm.apply(buf, thetas, shifts, rows)  # type: ignore[no-untyped-call]
    return y


class ShiftAdd(torch.autograd.Function):
    r""":math:`Y = \sum_j S_{[f_j, f_j + R),\,j}` (the shift-and-add of the fused x·Θ order)."""

    @staticmethod
    def forward(ctx: Any, s: torch.Tensor, shifts: tuple[int, ...], rows: int) -> torch.Tensor:
        y = s[shifts[0] : shifts[0] + rows, 0].clone()
        for j in range(1, len(shifts)):
            y += s[shifts[j] : shifts[j] + rows, j]
        ctx.shape, ctx.shifts, ctx.rows = s.shape, shifts, rows
        return y

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_s = grad.new_zeros(ctx.shape)  # slice assignments: differentiable, so double backward is exact
        for j, f in enumerate(ctx.shifts):
            grad_s[f : f + ctx.rows, j] = grad
        return grad_s, None, None


def gemm_shift(buf: torch.Tensor, thetas: torch.Tensor, shifts: tuple[int, ...], rows: int) -> torch.Tensor:
    r"""One GEMM :math:`S = X\,[\Theta_1\cdots\Theta_J]`, then :class:`ShiftAdd` (the fused x·Θ order).

    Parameters
    ----------
    buf, thetas, shifts, rows
        As for :meth:`structconv.backend.interface.Backend.shift_gemm`.
    """
    J, P, Q = (int(v) for v in thetas.shape)
    s = (buf @ thetas.permute(1, 0, 2).reshape(P, J * Q)).reshape(-1, J, Q)
    y: torch.Tensor = ShiftAdd.apply(s, shifts, rows)  # type: ignore[no-untyped-call]
    return y


def window_image(x: torch.Tensor, geo: Geometry) -> tuple[torch.Tensor, tuple[int, ...]]:
    """``(B, C, *grid)`` -> the window the native call reads, and the symmetric padding it applies.

    The window starts at the box origin of output 0 and spans what the last output reads; the
    part outside the grid is zero padding (passed to the native call when symmetric) or wrapped
    entries.  Its arithmetic is :attr:`Geometry.window`, done once per basis.

    Parameters
    ----------
    x
        ``(B, C, *grid)``.
    geo
        The basis' geometry.
    """
    w = geo.window
    if w.wrap is not None:
        for i, runs in enumerate(w.wrap):
            x = torch.cat([x.narrow(2 + i, start, length) for start, length in runs], 2 + i)
        return x, w.padding
    if w.crop is not None:
        x = x[(slice(None), slice(None), *w.crop)]
    if any(w.frame_lo) or any(w.frame_hi):
        x = F.pad(x, _pad_widths(w.frame_lo, w.frame_hi))
    return x, w.padding


def native_weight(thetas: torch.Tensor, geo: Geometry) -> torch.Tensor:
    """One ``(P, Q)`` map per tap -> a torch kernel ``(Q, P, *box)`` (taps scattered into their box).

    Parameters
    ----------
    thetas
        ``(J, P, Q)``.
    geo
        The basis' geometry (its box: :attr:`Geometry.box`).
    """
    _, P, Q = (int(s) for s in thetas.shape)
    _, _, size, index = geo.box
    if geo.is_full_box:
        return thetas.permute(2, 1, 0).reshape(Q, P, *size)
    box = thetas.new_zeros(geo.box_volume, P, Q)
    box = box.index_add(0, torch.as_tensor(index, device=thetas.device), thetas)  # repeated taps add up
    return box.permute(2, 1, 0).reshape(Q, P, *size)


def conv_image(
    x: torch.Tensor, weight: torch.Tensor, geo: Geometry, bias: torch.Tensor | None = None, groups: int = 1
) -> torch.Tensor:
    r"""The native call on torch's layout: ``(B, P, *grid)`` and a ``(Q, P/G, *box)`` kernel -> ``(B, Q, *out_grid)``.

    Parameters
    ----------
    x
        ``(B, P, *grid)``.
    weight
        ``(Q, P/G, *box)``, the kernel over the basis' box (:attr:`Geometry.box`).
    geo
        The basis' geometry.
    bias
        ``(Q,)``, added by the same call, or ``None``.
    groups
        :math:`G`, ``F.conv{d}d``'s: the kernel of a block-diagonal :math:`\Theta` stored by blocks.
    """
    window, padding = window_image(x, geo)
    return _CONV[geo.ndim](window, weight, bias, geo.stride, padding, geo.box[1], groups)


def bind_conv_image(
    geo: Geometry, groups: int
) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor | None], torch.Tensor]:
    r""":func:`conv_image` for one geometry and ``groups``, its arithmetic done now: ``run(x, weight, bias)``.

    Where the window is the grid itself (zero padding the native call applies on both sides
    alike, no crop, no wrap) the run is the bare ``F.conv{d}d`` call with its arguments bound, so
    a compiled contraction costs per call what ``torch.nn.Conv{d}d`` does.

    Parameters
    ----------
    geo
        The basis' geometry.
    groups
        :math:`G`, as :func:`conv_image` takes it.
    """
    w = geo.window
    native = _CONV[geo.ndim]
    if w.wrap is not None or w.crop is not None or any(w.frame_lo) or any(w.frame_hi):
        return lambda x, weight, bias: conv_image(x, weight, geo, bias, groups)
    # A partial, not a closure: no Python frame per call, and a compiled graph guards on its arguments alone.
    return functools.partial(native, stride=geo.stride, padding=w.padding, dilation=geo.box[1], groups=groups)


def native_conv(x: torch.Tensor, thetas: torch.Tensor, geo: Geometry) -> torch.Tensor:
    r"""The shift basis as one ``F.conv{1,2,3}d``: the A·Θ-first order with :math:`\Phi` kept as a kernel.

    ``thetas`` holds one ``(P, Q)`` map per tap; they are scattered into the smallest dilated
    box that holds every tap (a plain torch kernel when the taps fill it).

    Parameters
    ----------
    x
        ``(B, M, P)``.
    thetas
        ``(J, P, Q)``.
    geo
        The basis' geometry.
    """
    B, _, C = (int(s) for s in x.shape)
    Q = int(thetas.shape[2])
    y = conv_image(x.reshape(B, *geo.grid, C).movedim(-1, 1), native_weight(thetas, geo), geo)
    return y.reshape(B, Q, math.prod(geo.out_grid)).transpose(1, 2)


def native_depthwise(x: torch.Tensor, weights: torch.Tensor, geo: Geometry) -> torch.Tensor:
    r""":math:`A_k^\top x` for every member, channel by channel, as native calls: ``(B, M, C) -> (B, K, N, C)``.

    ``weights`` (``(K, J)``) are the tap weights of each member.  One member with equal weights
    on a plain box is ``F.avg_pool{1,2,3}d`` (times the weight sum); otherwise a depthwise
    ``F.conv{1,2,3}d`` with ``groups = C``.

    Parameters
    ----------
    x
        ``(B, M, C)``.
    weights
        ``(K, J)``.
    geo
        The basis' geometry.
    """
    B, _, C = (int(s) for s in x.shape)
    K = int(weights.shape[0])
    _, dilation, size, index = geo.box
    window, padding = window_image(x.reshape(B, *geo.grid, C).movedim(-1, 1), geo)
    N = math.prod(geo.out_grid)
    # The pooling shortcut would send the gradient of equal but learnable weights to one of them.
    # Weights on the meta device hold no values to compare: the depthwise convolution needs none.
    learnable = torch.is_grad_enabled() and weights.requires_grad
    readable = weights.device.type != "meta"
    # Compiled, the depthwise convolution (the same sum) spares a host read of the weights.
    constant = readable and not torch.compiler.is_compiling()
    uniform = K == 1 and geo.is_full_box and not learnable and constant and bool((weights == weights[0, 0]).all())
    pool_ok = all(d == 1 for d in dilation) and all(2 * p <= k for p, k in zip(padding, size, strict=True))
    if geo.ndim == 3:  # avg_pool3d refuses windows smaller than the kernel and, on the CPU, bfloat16
        pool_ok = pool_ok and all(int(w) >= k for w, k in zip(window.shape[2:], size, strict=True))
        pool_ok = pool_ok and not (window.dtype == torch.bfloat16 and window.device.type == "cpu")
    if uniform and pool_ok:
        pooled = _AVG_POOL[geo.ndim](window, size, geo.stride, padding, count_include_pad=True)
        y = pooled * (weights[0, 0] * geo.taps)
        return y.reshape(B, C, N).transpose(1, 2)[:, None]
    box = weights.new_zeros(K, geo.box_volume)
    box = box.index_add(1, torch.as_tensor(index, device=weights.device), weights)
    kernel = box.reshape(K, 1, *size).repeat(C, 1, *([1] * geo.ndim))
    y = _CONV[geo.ndim](window, kernel, stride=geo.stride, padding=padding, dilation=dilation, groups=C)
    return y.reshape(B, C, K, N).permute(0, 2, 3, 1)
