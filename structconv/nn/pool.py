r"""Drop-in average pooling: ``AvgPool{1,2,3}d`` as one-member shift bases.

Each layer is :func:`structconv.avg_pool_basis` for the input's grid, with :math:`\Theta = I`
per channel, so it evaluates :math:`A^\top x` (:func:`structconv.apply_shifts`: the native
``F.avg_pool{d}d`` or depthwise ``F.conv{d}d`` on torch, slicing otherwise) instead of spending a
GEMM on the identity.  The layers take torch's layouts (``(B, C, *grid)`` or unbatched
``(C, *grid)``) and torch's constructor arguments, ``ceil_mode`` and ``divisor_override``
included, in torch's order with torch's defaults (structconv's own ``order``, and
``AvgPool1d``'s ``divisor_override``, which torch's ``AvgPool1d`` lacks, keyword-only).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import nn

from ..backend.cache import BoundedCache
from ..bases.grid import GridBasis, Size, _ints
from ..structures.grid import Padding, apply_shifts, avg_pool_basis
from ._grid_common import grid_and_like, own_init, split_input
from ._grid_docs import pool_doc
from ._module import NotScriptable, StructureOutsideGraph, warn_jit_trace

_ORDERS = ("auto", "native", "shift")  # apply_shifts'


class _AvgPoolNd(StructureOutsideGraph, NotScriptable, nn.Module):
    _ndim = 0

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "__init__" not in cls.__dict__:  # AvgPool1d has its own: torch's AvgPool1d lacks divisor_override
            own_init(cls, _AvgPoolNd.__init__)  # a wrong call's TypeError names the public layer

    def __init__(
        self,
        kernel_size: Size,
        stride: Size | None = None,
        padding: Padding = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        divisor_override: int | None = None,
        *,
        order: str = "auto",
    ) -> None:
        super().__init__()
        name = type(self).__name__
        if divisor_override is not None:  # torch takes any integer but 0 (a negative one flips the sign)
            bad = isinstance(divisor_override, bool) or not isinstance(divisor_override, int | np.integer)
            if bad or divisor_override == 0:
                raise ValueError(f"{name}: divisor_override must be a non-zero integer, got {divisor_override!r}")
            divisor_override = int(divisor_override)
        d = self._ndim
        self.kernel_size = _ints(kernel_size, d, "kernel_size", 1)
        self.stride = self.kernel_size if stride is None else _ints(stride, d, "stride", 1)
        self.padding = padding
        self.ceil_mode = bool(ceil_mode)
        self.count_include_pad = count_include_pad
        self.divisor_override = divisor_override
        if order not in _ORDERS:
            raise ValueError(f"{name}: order must be one of {_ORDERS}, got {order!r}")
        self.order = order
        self._bases: BoundedCache[GridBasis] = BoundedCache(size=8)  # per input grid

    def basis(self, x: torch.Tensor | tuple[int, ...], like: torch.Tensor | None = None) -> GridBasis:
        """The one-member averaging basis on the input ``x`` (or on a grid of sizes ``x``, like ``like``).

        Pooling has no :math:`\\Theta` (it is :math:`I` per channel): the layer's output is
        ``apply_shifts(basis, x.flatten(2).transpose(1, 2))`` in ``(B, 1, M, C)`` layout (one member).
        """
        grid, like = grid_and_like(x, like, self._ndim, type(self).__name__)

        def build() -> GridBasis:
            # On the meta device the column scale of count_include_pad=False (a check of its
            # values included) is formed on the host, then placed beside the input as an explicit scale.
            meta = like.device.type == "meta"
            b = avg_pool_basis(
                grid, self.kernel_size, stride=self.stride, padding=self.padding, ceil_mode=self.ceil_mode,
                count_include_pad=self.count_include_pad, like=torch.empty(0, dtype=like.dtype) if meta else like,
            )  # fmt: skip
            g = b.geometry
            if meta and self.divisor_override is None:
                scale = b.column_scale()
                weights = b.tap_weights().to(like.device)
                scale = None if scale is None else scale.to(like.device)
                return GridBasis(
                    g.grid, g.out_grid, g.offsets, stride=g.stride, boundary=g.boundary, weights=weights, scale=scale
                )
            if self.divisor_override is None:
                return b
            w = torch.full((1, g.taps), 1.0 / self.divisor_override, dtype=like.dtype, device=like.device)
            return GridBasis(g.grid, g.out_grid, g.offsets, stride=g.stride, boundary=g.boundary, weights=w)

        settings = (self.kernel_size, self.stride, str(self.padding), self.ceil_mode, self.count_include_pad,
                    self.divisor_override)  # fmt: skip
        key = (grid, like.dtype, str(like.device), settings)
        return self._bases.find(key) or self._bases.put(key, build())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Average ``x`` of shape ``(B, C, *grid)`` (or unbatched) like ``torch.nn.AvgPool{d}d``: :math:`A^\\top x`."""
        warn_jit_trace(self)
        self.prepare_outside_graph(x)
        name = type(self).__name__
        xb, unbatched = split_input(x, self._ndim, None, name)
        if self._ndim == 3 and xb.dtype == torch.float16 and xb.device.type == "cpu":
            raise NotImplementedError(
                f"{name}: torch has no CPU kernel for 3-d average pooling (avg_pool3d) of an input of dtype "
                f"{xb.dtype}; use float32 or bfloat16 on the CPU, or float16 on a GPU"
            )
        B, C = int(xb.shape[0]), int(xb.shape[1])
        basis = self.basis(tuple(int(s) for s in xb.shape[2:]), xb)
        flat = xb.flatten(2).transpose(1, 2)
        # An empty batch (or no channels): apply_shifts refuses empty arrays, the slicing kernel does not.
        y: torch.Tensor = (apply_shifts(basis, flat, order=self.order) if B and C else basis.apply_each(flat))[:, 0]
        y = y.transpose(1, 2).reshape(B, C, *basis.out_grid)
        return y[0] if unbatched else y

    def extra_repr(self) -> str:
        s = f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding!r}"
        return s + (", ceil_mode=True" if self.ceil_mode else "")


class AvgPool1d(_AvgPoolNd):
    __doc__ = pool_doc(1)

    _ndim = 1

    def __init__(
        self,
        kernel_size: Size,
        stride: Size | None = None,
        padding: Padding = 0,
        ceil_mode: bool = False,
        count_include_pad: bool = True,
        *,
        divisor_override: int | None = None,
        order: str = "auto",
    ) -> None:
        # torch's AvgPool1d has no divisor_override: here it is structconv's own option, keyword-only.
        super().__init__(kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override, order=order)


class AvgPool2d(_AvgPoolNd):
    __doc__ = pool_doc(2)

    _ndim = 2


class AvgPool3d(_AvgPoolNd):
    __doc__ = pool_doc(3)

    _ndim = 3
